"""The bundled examples' configs as Triton hands them to a model, with parameters overridden:
one reading shared by the tests that build specs, engines and whole models from them."""

import json

from google.protobuf.json_format import MessageToDict

from latte.backend.config import parse_model_config
from latte.generator.validate import parse_config_file


def example_config(repo, model, **parameters) -> dict:
    """repo/model's config.pbtxt as a dict, each keyword a string parameter set over it."""
    config = MessageToDict(parse_config_file(repo / model / "config.pbtxt"), preserving_proto_field_name=True)
    for key, value in parameters.items():
        config.setdefault("parameters", {})[key] = {"string_value": value}
    return config


def example_spec(repo, model, device="cpu", **parameters):
    """The parsed ModelSpec, for an instance on `device`."""
    return parse_model_config(example_config(repo, model, **parameters), repo / model, "1", device=device)


def example_model(repo, model, kind=None, **parameters):
    """A LatteModel over the stand-in stub, as Triton initialises it; `kind` "GPU" makes it a
    KIND_GPU instance on device 0."""
    from latte.backend.standin_stub import StandinStub
    from latte.backend.triton_model import LatteModel

    args = {"model_config": json.dumps(example_config(repo, model, **parameters)),
            "model_repository": str(repo / model), "model_version": "1"}
    if kind is not None:
        args.update(model_instance_kind=kind, model_instance_device_id="0")
    return LatteModel(args, StandinStub)
