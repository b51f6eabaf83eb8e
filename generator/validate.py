"""Checking configs with Triton's own `ModelConfig` protobuf."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format


class InvalidConfig(ValueError):
    """A config.pbtxt that Triton would refuse; the message names the file and line."""


def model_config_class():
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2.ModelConfig


def parse_config(text: str, source: str = "config.pbtxt"):
    """Parse config text into Triton's ModelConfig message, or raise InvalidConfig."""
    message = model_config_class()()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        raise InvalidConfig(f"{source}: {exc}") from None
    if not message.name:
        raise InvalidConfig(f"{source}: the config has no name")
    return message


def parse_config_file(path: Path):
    path = Path(path)
    config = parse_config(path.read_text(), str(path))
    if config.name != path.parent.name:
        raise InvalidConfig(f"{path}: name {config.name!r} differs from its folder {path.parent.name!r}")
    return config
