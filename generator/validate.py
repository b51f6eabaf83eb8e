"""Checking configs with Triton's own `ModelConfig` protobuf; every problem as file:line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Tuple

from google.protobuf import text_format

from latte.generator.pbtxt_lines import KeyPath, field_lines, format_field_path, nearest_line


class InvalidConfig(ValueError):
    """A config.pbtxt that Triton would refuse; the message names the file and line."""


def model_config_class():
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2.ModelConfig


def _parse_error_text(exc: text_format.ParseError) -> str:
    # ParseError's own text starts "LINE:COLUMN : "; the located prefix replaces it.
    text = str(exc)
    prefix = f"{exc.GetLine()}:{exc.GetColumn()} : " if exc.GetColumn() is not None else f"{exc.GetLine()} : "
    return text[len(prefix):] if text.startswith(prefix) else text


def parse_config(text: str, source: str = "config.pbtxt"):
    """Parse config text into Triton's ModelConfig message, or raise InvalidConfig naming source:line."""
    message = model_config_class()()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        if exc.GetLine() is None:
            raise InvalidConfig(f"{source}: {exc}") from None
        column = f":{exc.GetColumn()}" if exc.GetColumn() is not None else ""
        raise InvalidConfig(f"{source}:{exc.GetLine()}{column}: {_parse_error_text(exc)}") from None
    if not message.name:
        raise InvalidConfig(f"{source}:1: name: the config has no name")
    return message


@dataclass
class ConfigFile:
    """A parsed config.pbtxt and the line of each of its fields."""
    path: Path
    config: Any
    lines: Dict[KeyPath, int]

    def where(self, field_path: KeyPath) -> str:
        """'file:line: field' for a field path; a field not in the text is placed at its parent."""
        place = format_field_path(field_path, self.config.DESCRIPTOR)
        return f"{self.path}:{nearest_line(self.lines, field_path)}: {place}"


def read_config_file(path: Path) -> ConfigFile:
    """Parse a model folder's config.pbtxt, checking its name against the folder, or raise InvalidConfig."""
    path = Path(path)
    text = path.read_text()
    config = parse_config(text, str(path))
    found = ConfigFile(path, config, field_lines(text, config.DESCRIPTOR))
    if config.name != path.parent.name:
        raise InvalidConfig(f"{found.where(('name',))}: {config.name!r} differs from its folder "
                            f"{path.parent.name!r}")
    return found


def parse_config_file(path: Path):
    return read_config_file(path).config


# Triton 2.51's dynamic batcher waits for an idle instance when it cannot prefetch a batch,
# and that wait can miss the instance's wake-up for its full 500 ms timeout (docs/backend.md,
# "Priorities"). It cannot prefetch once any priority level or queue limit is set; a second
# instance wakes it when it finishes, so only one instance is exposed.
BATCHER_SLOT_WAIT_MS = 500
STALL_FREE_INSTANCES = 2


def batcher_prefetch_disabled(batching) -> bool:
    """Whether Triton's queue for this ModelDynamicBatching refuses to prefetch batches."""
    policy = batching.default_queue_policy
    return bool(batching.priority_levels or policy.default_timeout_microseconds
                or policy.allow_timeout_override or policy.max_queue_size)


def instance_count(config) -> int:
    """Instances a ModelConfig asks for; a group without a count has one (per listed GPU)."""
    if not config.instance_group:
        return 1
    return sum(max(1, group.count) * max(1, len(group.gpus)) for group in config.instance_group)


def batcher_stall(config):
    """The warning for a ModelConfig whose one instance can sit idle ~500 ms with requests
    queued (Triton 2.51), else None."""
    if not config.HasField("dynamic_batching") or not batcher_prefetch_disabled(config.dynamic_batching):
        return None
    if instance_count(config) >= STALL_FREE_INSTANCES:
        return None
    return (f"{config.name}: one instance with dynamic_batching priority_levels or a default_queue_policy "
            f"limit stalls up to {BATCHER_SLOT_WAIT_MS} ms in Triton 2.51's batcher under concurrent load; "
            f"use instance_group count >= {STALL_FREE_INSTANCES}, or drop priority_levels and the queue policy "
            "(docs/backend.md, Priorities)")


def sessions_split(config):
    """The warning for a latte model that keeps sessions on more than one instance, else None:
    each instance holds its own sessions and Triton hands a request to any instance."""
    if config.backend != "latte" or "session_input" not in config.parameters:
        return None
    count = instance_count(config)
    if count < 2:
        return None
    return (f"{config.name}: sessions (session_input) live in one model instance, but {count} instances share "
            "the requests: a session's next request can reach an instance that does not hold it and be refused "
            "as an unknown session; serve a model with sessions on one instance (docs/backend.md, Sessions)")


def config_warnings(config) -> list:
    """What `latte validate` warns about in one ModelConfig (the config loads, but serves badly)."""
    return [w for w in (batcher_stall(config), sessions_split(config)) if w]


class RepositoryError(ValueError):
    """A model repository with problems; `problems` holds one located line each."""

    def __init__(self, problems) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def _data_type_name(value: int) -> str:
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2.DataType.Name(value)


def _tensors(tensors) -> Dict:
    from latte.generator.dag import TensorInfo

    return {t.name: TensorInfo(_data_type_name(t.data_type), tuple(t.dims)) for t in tensors}


def config_field_path(path: KeyPath) -> Tuple:
    """An ensemble key path, as check_ensemble speaks of it, as the config.pbtxt field path it came from."""
    if path and path[0] == "steps":
        field = ("ensemble_scheduling", "step") + tuple(path[1:2])
        if len(path) > 2:
            field += ({"inputs": "input_map", "outputs": "output_map", "model": "model_name"}[path[2]],)
        return field + tuple(path[3:4])
    if path and path[0] in ("inputs", "outputs"):
        return (path[0][:-1],) + tuple(path[1:])
    return tuple(path)


def interface_of(config, source: ConfigFile = None):
    """The tensors and batching of a parsed ModelConfig, as the ensemble check sees them.

    With its `source`, the check reports a tensor that disagrees with its neighbours at
    this model's own declaration of it.
    """
    from latte.generator.dag import Interface

    return Interface(
        name=config.name, max_batch_size=config.max_batch_size,
        inputs=_tensors(config.input), outputs=_tensors(config.output),
        optional_inputs=tuple(t.name for t in config.input if t.optional),
        where=(lambda path: source.where(config_field_path(path))) if source is not None else None,
    )


def ensemble_wiring(config):
    from latte.generator.dag import EnsembleWiring, StepWiring

    steps = [StepWiring(s.model_name, dict(s.input_map), dict(s.output_map))
             for s in config.ensemble_scheduling.step]
    return EnsembleWiring(name=config.name, max_batch_size=config.max_batch_size,
                          inputs=_tensors(config.input), outputs=_tensors(config.output), steps=steps)


def _policy_problems(model_dir: Path, found: "ConfigFile", present: list) -> list:
    """Versions the version_policy asks for that have no folder: Triton would serve fewer, or none."""
    policy = found.config.version_policy
    kind = policy.WhichOneof("policy_choice")
    listed = ", ".join(map(str, present))
    if kind == "specific":
        return [f"{found.where(('version_policy',))}: lists version {v}, but {model_dir}/{v}/ does "
                f"not exist (version folders: {listed})" for v in policy.specific.versions if v not in present]
    if kind == "latest" and policy.latest.num_versions > len(present):
        return [f"{found.where(('version_policy',))}: serves the latest "
                f"{policy.latest.num_versions} versions, but only {len(present)} version folder(s) exist ({listed})"]
    return []


def _version_problems(model_dir: Path, found: ConfigFile) -> list:
    config = found.config
    versions = [d for d in model_dir.iterdir() if d.is_dir() and d.name.isdigit()]
    if config.platform == "ensemble":
        return []
    if not versions:
        return [f"{model_dir}: no version folder (e.g. {model_dir}/1/) holding the model"]
    problems = _policy_problems(model_dir, found, sorted(int(v.name) for v in versions))
    params = {k: v.string_value for k, v in config.parameters.items()}
    for version in versions:
        if config.backend == "python" and not (version / "model.py").exists():
            problems.append(f"{found.where(('backend',))}: a python-backend model needs {version}/model.py, "
                            "which does not exist")
        if config.backend == "latte" and params.get("model_file") and not (version / params["model_file"]).exists():
            problems.append(f"{found.where(('parameters', 'model_file'))}: names {params['model_file']!r}, "
                            f"which is not in {version}/")
    for warmup in config.model_warmup:
        for name, data in warmup.inputs.items():
            if data.input_data_file and not (model_dir / "warmup" / data.input_data_file).exists():
                where = found.where(("model_warmup", warmup.name, "inputs", name, "input_data_file"))
                problems.append(f"{where}: reads warmup/{data.input_data_file}, which does not exist in "
                                f"{model_dir}/")
    return problems


def validate_repository(repo: Path):
    """Parse every config.pbtxt in REPO and check each ensemble's DAG; returns the configs.

    Raises RepositoryError listing every problem found, each naming its file and line
    (or the folder, for a file that is missing).
    """
    from latte.generator.dag import check_ensemble

    repo = Path(repo)
    if not repo.is_dir():
        raise RepositoryError([f"{repo}: the model repository does not exist"])
    files: Dict[str, ConfigFile] = {}
    problems = []
    for model_dir in sorted(d for d in repo.iterdir() if d.is_dir()):
        path = model_dir / "config.pbtxt"
        if not path.exists():
            problems.append(f"{model_dir}: no config.pbtxt")
            continue
        try:
            files[model_dir.name] = read_config_file(path)
        except InvalidConfig as exc:
            problems.append(str(exc))
            continue
        problems.extend(_version_problems(model_dir, files[model_dir.name]))
    interfaces = {name: interface_of(f.config, f) for name, f in files.items()}
    for found in files.values():
        if found.config.platform != "ensemble":
            continue
        problems.extend(check_ensemble(ensemble_wiring(found.config), interfaces,
                                       lambda p, f=found: f.where(config_field_path(p))))
    if problems:
        raise RepositoryError(problems)
    if not files:
        raise RepositoryError([f"{repo}: no model folders with a config.pbtxt"])
    return {name: f.config for name, f in files.items()}
