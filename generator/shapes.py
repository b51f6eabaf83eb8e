"""Which inputs a model file takes: from --input flags, a config.pbtxt beside it, or the ONNX graph."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from latte.backend.config import GRAPH_FILE, RUNTIME_BY_EXTENSION, RUNTIMES
from latte.backend.dtypes import TRITON_TYPES

DEFAULT_MAX_LENGTH = 128


class ShapeError(ValueError):
    """The model's inputs cannot be determined or were given wrongly."""


@dataclass
class ModelShapes:
    runtime: str
    inputs: List[dict]          # [{name, data_type, dims, ragged}] without the batch dimension
    outputs: List[dict]         # dims may be empty: learnt from the first run
    batched: bool
    max_length: int
    source: str                 # where the shapes came from, for the report
    # requests (one row each) the model is known to accept, batches are made of where there are
    # some: a fused model whose first step parses what it is sent (images) has its own
    samples: Optional[List[dict]] = None

    @property
    def variable(self) -> bool:
        return any(-1 in t["dims"] for t in self.inputs)


def parse_input_flag(text: str) -> dict:
    """'tokens:INT64:-1' or 'image:FP32:3,32,32' -> {name, data_type, dims}."""
    parts = text.split(":")
    if len(parts) != 3 or not all(parts):
        raise ShapeError(f"--input {text!r}: expected name:dtype:dims, e.g. image:FP32:3,32,32 or tokens:INT64:-1")
    name, dtype, dims_text = parts
    data_type = dtype.upper() if dtype.upper().startswith("TYPE_") else "TYPE_" + dtype.upper()
    if data_type not in TRITON_TYPES:
        raise ShapeError(f"--input {text!r}: unknown data type {dtype!r}; expected one of "
                         f"{', '.join(t[5:] for t in TRITON_TYPES)}")
    try:
        dims = [int(d) for d in dims_text.replace("x", ",").split(",")]
    except ValueError:
        raise ShapeError(f"--input {text!r}: dims must be integers separated by commas, -1 for a variable one") from None
    if any(d == 0 or d < -1 for d in dims):
        raise ShapeError(f"--input {text!r}: dims must be positive or -1, got {dims}")
    return {"name": name, "data_type": data_type, "dims": dims}


def _config_beside(model_file: Path):
    from latte.generator.validate import parse_config

    for folder in (model_file.parent, model_file.parent.parent):
        path = folder / "config.pbtxt"
        if path.exists():
            return parse_config(path.read_text(), str(path)), path
    return None, None


def _described_tensors(model_file: Path, runtime: str):
    """Inputs and outputs (dims with the batch dimension) as the backend's auto-complete reads them."""
    from latte.backend.autocomplete import describe_onnx, describe_torch_export

    described = (describe_onnx if runtime == "onnx" else describe_torch_export)(Path(model_file))

    def rename(tensors):
        return [{"name": t["name"], "data_type": t["data_type"], "all_dims": t["dims"]} for t in tensors]
    return rename(described["inputs"]), rename(described["outputs"])


def resolve_shapes(model_file: Path, runtime: Optional[str] = None, inputs: Optional[List[dict]] = None,
                   max_length: Optional[int] = None) -> ModelShapes:
    model_file = Path(model_file)
    runtime = runtime or RUNTIME_BY_EXTENSION.get(model_file.suffix) or ("graph" if model_file.name == GRAPH_FILE else None)
    if runtime not in RUNTIMES:
        raise ShapeError(f"cannot tell the runtime of {model_file.name}; pass --runtime "
                         f"({', '.join(sorted(RUNTIMES))})")
    config, config_path = _config_beside(model_file)
    config_length = None
    if config is not None:
        from latte.generator.validate import interface_of

        raw = config.parameters.get("max_sequence_length")
        config_length = int(raw.string_value) if raw is not None and raw.string_value else None
        iface = interface_of(config)
        ragged = {t.name for t in config.input if t.allow_ragged_batch}
        found_inputs = [{"name": n, "data_type": i.data_type, "dims": list(i.dims), "ragged": n in ragged}
                        for n, i in iface.inputs.items()]
        found_outputs = [{"name": n, "data_type": i.data_type, "dims": list(i.dims)} for n, i in iface.outputs.items()]
        batched, source = config.max_batch_size > 0, str(config_path)
    elif runtime in ("onnx", "torch_export"):
        graph_in, graph_out = _described_tensors(model_file, runtime)
        batched = all(t["all_dims"] and t["all_dims"][0] == -1 for t in graph_in)
        cut = 1 if batched else 0
        found_inputs = [{"name": t["name"], "data_type": t["data_type"], "dims": t["all_dims"][cut:]} for t in graph_in]
        found_outputs = [{"name": t["name"], "data_type": t["data_type"], "dims": t["all_dims"][cut:]}
                         for t in graph_out]
        source = "the ONNX graph" if runtime == "onnx" else "the torch.export program"
    else:
        found_inputs, found_outputs, batched, source = None, [{"name": "output0", "dims": []}], True, "--input"
    if inputs:
        found_inputs, source = inputs, "--input" if config is None else f"--input and {config_path}"
    if not found_inputs:
        raise ShapeError(f"cannot tell the inputs of {model_file.name}: pass --input name:dtype:dims (repeatable) "
                         "or put a config.pbtxt next to the file")
    for t in found_inputs:
        t.setdefault("ragged", batched and -1 in t["dims"])
    return ModelShapes(runtime=runtime, inputs=found_inputs, outputs=found_outputs, batched=batched,
                       max_length=max_length or config_length or DEFAULT_MAX_LENGTH, source=source)
