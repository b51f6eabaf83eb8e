"""Filling a minimal config.pbtxt from the model file, so hand-written configs stay short.

Triton calls `auto_complete_config` before `initialize`, without the model's path.
The Python backend's stub is started as `triton_python_backend_stub <version dir>/model.py
...`, so the version folder is read from the process's command line.

Sources, in order: a sidecar `<model file>.json` ({"inputs": [...], "outputs": [...],
"max_batch_size": N}, tensors as {"name", "data_type", "dims"}), then the model itself: the
ONNX graph, a torch.export program's graph signature, or a TensorRT plan's engine where
tensorrt imports and a GPU is visible. TorchScript files record no tensor
shapes, so they need the sidecar (or a config that lists its tensors).

torch.export outputs have no names: a forward that returns a dict names them by its keys;
otherwise they are `output0`, `output1`, ... in return order, which is how the torch runtime
maps a returned tuple onto the config's outputs (by position).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Mapping, Optional

from latte.backend.config import RUNTIME_BY_EXTENSION, ConfigError, find_model_file, parameters_of
from latte.backend.dtypes import to_triton

# ONNX TensorProto element types -> Triton types.
_ONNX_TYPES = {1: "TYPE_FP32", 2: "TYPE_UINT8", 3: "TYPE_INT8", 4: "TYPE_UINT16", 5: "TYPE_INT16",
               6: "TYPE_INT32", 7: "TYPE_INT64", 9: "TYPE_BOOL", 10: "TYPE_FP16", 11: "TYPE_FP64",
               12: "TYPE_UINT32", 13: "TYPE_UINT64"}
DEFAULT_MAX_BATCH_SIZE = 8


def stub_version_dir(cmdline_path: str = "/proc/self/cmdline") -> Optional[Path]:
    try:
        argv = Path(cmdline_path).read_bytes().split(b"\0")
    except OSError:
        return None
    if len(argv) < 2 or not argv[1].endswith(b"model.py"):
        return None
    return Path(argv[1].decode()).parent


def describe_onnx(path: Path) -> Dict:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}

    def tensors(values) -> List[Dict]:
        out = []
        for v in values:
            if v.name in initializers:
                continue
            t = v.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
            data_type = _ONNX_TYPES.get(t.elem_type)
            if data_type is None:
                raise ValueError(f"{path.name}: tensor {v.name!r} has an ONNX type latte cannot serve ({t.elem_type})")
            out.append({"name": v.name, "data_type": data_type, "dims": dims})
        return out

    inputs, outputs = tensors(graph.input), tensors(graph.output)
    batched = all(t["dims"] and t["dims"][0] == -1 for t in inputs + outputs)
    return {"inputs": inputs, "outputs": outputs, "batched": batched}


def describe_torch_export(path: Path) -> Dict:
    """Inputs from the program's user-input placeholders (named as forward's arguments),
    outputs from its user outputs; symbolic (dynamic) dimensions become -1."""
    import torch

    try:
        program = torch.export.load(str(path))
    except Exception as exc:
        raise ConfigError(f"{path.name}: torch.export.load could not read it: {exc}") from exc
    signature = program.graph_signature
    nodes = {n.name: n for n in program.graph.nodes}

    def tensor(name: str, value, what: str) -> Dict:
        if not isinstance(value, torch.Tensor):
            raise ConfigError(f"{path.name}: {what} {name!r} is a {type(value).__name__}, not a tensor; "
                              f"latte serves tensor inputs and outputs only")
        try:
            data_type = to_triton(torch.empty(0, dtype=value.dtype).numpy().dtype)
        except (TypeError, ValueError):
            raise ConfigError(f"{path.name}: {what} {name!r} has dtype {value.dtype}, which latte cannot serve") from None
        dims = [d if isinstance(d, int) else -1 for d in value.shape]
        return {"name": name, "data_type": data_type, "dims": dims}

    placeholders = list(signature.user_inputs)
    # Placeholder names follow forward's arguments, but torch renames clashes (a parameter
    # called like an argument); the recorded argument names are the ones a caller knows.
    call_graph = program.module_call_graph
    forward_names = list(call_graph[0].signature.forward_arg_names or []) if call_graph and call_graph[0].signature else []
    names = forward_names if len(forward_names) == len(placeholders) else placeholders
    inputs = [tensor(name, nodes[p].meta.get("val"), "input") for name, p in zip(names, placeholders)]

    output_node = next(n for n in program.graph.nodes if n.op == "output")
    by_name = {a.name: a for a in output_node.args[0] if hasattr(a, "name")}
    returned = [by_name[n].meta.get("val") if n in by_name else None for n in signature.user_outputs]
    out_spec = program.call_spec.out_spec
    keys = list(out_spec.context) if out_spec is not None and out_spec.type is dict else []
    out_names = [str(k) for k in keys] if len(keys) == len(returned) else [f"output{i}" for i in range(len(returned))]
    outputs = [tensor(name, value, "output") for name, value in zip(out_names, returned)]
    batched = all(t["dims"] and t["dims"][0] == -1 for t in inputs + outputs)
    return {"inputs": inputs, "outputs": outputs, "batched": batched}


def describe_model(path: Path) -> Optional[Dict]:
    sidecar = path.with_name(path.name + ".json")
    if sidecar.exists():
        described = json.loads(sidecar.read_text())
        described.setdefault("batched", "max_batch_size" in described)
        return described
    runtime = RUNTIME_BY_EXTENSION.get(path.suffix)
    if runtime == "onnx":
        return describe_onnx(path)
    if runtime == "torch_export":
        return describe_torch_export(path)
    if runtime == "tensorrt":
        from latte.backend.runtimes.tensorrt_runtime import describe_plan

        return describe_plan(path)
    return None


def _nothing_describes(path: Path) -> ConfigError:
    runtime = RUNTIME_BY_EXTENSION.get(path.suffix)
    if runtime == "torchscript":
        why = "TorchScript records no tensor shapes"
    elif runtime == "tensorrt":
        why = "a TensorRT plan's tensors can only be read where the tensorrt package imports and a GPU is visible"
    else:
        why = f"latte cannot read tensor shapes from a {path.suffix} file"
    return ConfigError(
        f"{path.name}: {why}, so the config's inputs and outputs cannot be filled in; list them in "
        f"config.pbtxt, or write {path.name}.json beside it as {{\"max_batch_size\": N, \"inputs\": "
        f"[{{\"name\", \"data_type\", \"dims\"}}], \"outputs\": [...]}} (dims with the batch dimension as -1)")


def complete(config: Mapping, version_dir: Optional[Path]) -> Dict:
    """What to add to `config`: max_batch_size, inputs, outputs, dynamic_batching (may be empty)."""
    additions: Dict = {}
    if version_dir is None or (config.get("input") and config.get("output")):
        return additions
    path = find_model_file(version_dir, parameters_of(config))
    if path is None or not path.exists():
        return additions
    described = describe_model(path)
    if described is None:
        raise _nothing_describes(path)
    max_batch_size = int(config.get("max_batch_size", 0))
    if max_batch_size == 0 and described.get("batched"):
        max_batch_size = int(described.get("max_batch_size", DEFAULT_MAX_BATCH_SIZE))
        additions["max_batch_size"] = max_batch_size
    strip = 1 if max_batch_size > 0 and described.get("batched") else 0
    if not config.get("input"):
        additions["inputs"] = [{**t, "dims": t["dims"][strip:]} for t in described["inputs"]]
    if not config.get("output"):
        additions["outputs"] = [{**t, "dims": t["dims"][strip:]} for t in described["outputs"]]
    if max_batch_size > 0 and not config.get("dynamic_batching") and not config.get("sequence_batching"):
        additions["dynamic_batching"] = True
    return additions


def apply(auto_complete_model_config, additions: Mapping) -> None:
    """Write `additions` through the stub's ModelConfig helper."""
    if "max_batch_size" in additions:
        auto_complete_model_config.set_max_batch_size(additions["max_batch_size"])
    for t in additions.get("inputs", []):
        auto_complete_model_config.add_input(t)
    for t in additions.get("outputs", []):
        auto_complete_model_config.add_output(t)
    if additions.get("dynamic_batching"):
        auto_complete_model_config.set_dynamic_batching()
