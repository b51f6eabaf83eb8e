"""What a TensorRT plan's IO tensors accept, as plain data: dtypes, profile ranges, buffer sizes.

Nothing here imports tensorrt or touches a GPU, so every rule the TensorRT runtime applies
to a request is checked the same way on machines without either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from latte.backend.dtypes import to_triton
from latte.backend.runtimes.base import RuntimeLoadError

Shape = Tuple[int, ...]

# TensorRT DataType member name -> (numpy dtype, torch dtype attribute).
SERVABLE_DTYPES: Dict[str, Tuple[np.dtype, str]] = {
    "FLOAT": (np.dtype(np.float32), "float32"),
    "HALF": (np.dtype(np.float16), "float16"),
    "INT8": (np.dtype(np.int8), "int8"),
    "INT32": (np.dtype(np.int32), "int32"),
    "INT64": (np.dtype(np.int64), "int64"),
    "BOOL": (np.dtype(np.bool_), "bool"),
    "UINT8": (np.dtype(np.uint8), "uint8"),
}
# Types TensorRT has that neither numpy nor Triton's Python backend can carry as is.
_NO_NUMPY_EQUIVALENT = {"BF16", "FP8", "INT4", "FP4", "E8M0"}


def enum_name(value) -> str:
    """`trt.DataType.HALF` -> "HALF" (pybind11 enums print as "DataType.HALF")."""
    name = getattr(value, "name", None)
    return name if isinstance(name, str) else str(value).rsplit(".", 1)[-1]


def numpy_dtype(trt_dtype_name: str, tensor: str) -> np.dtype:
    """The numpy dtype for a plan tensor of TensorRT type `trt_dtype_name`."""
    if trt_dtype_name in SERVABLE_DTYPES:
        return SERVABLE_DTYPES[trt_dtype_name][0]
    servable = ", ".join(SERVABLE_DTYPES)
    if trt_dtype_name in _NO_NUMPY_EQUIVALENT:
        raise RuntimeLoadError(
            f"plan tensor {tensor!r} has TensorRT type {trt_dtype_name}, which latte cannot pass in or out "
            f"(servable IO types: {servable}); rebuild the plan with FP32 or FP16 IO, e.g. "
            f"trtexec --inputIOFormats=fp32:chw --outputIOFormats=fp32:chw (the layers inside may stay {trt_dtype_name})"
        )
    raise RuntimeLoadError(
        f"plan tensor {tensor!r} has TensorRT type {trt_dtype_name}, which latte does not know "
        f"(servable IO types: {servable})"
    )


def torch_dtype_name(dtype: np.dtype) -> str:
    for numpy_type, torch_name in SERVABLE_DTYPES.values():
        if numpy_type == dtype:
            return torch_name
    raise ValueError(f"numpy dtype {dtype} is not a TensorRT IO type latte serves")


@dataclass(frozen=True)
class PlanTensor:
    """One IO tensor of a plan as the engine declares it (-1 = set per call)."""

    name: str
    dtype: np.dtype
    shape: Shape

    @property
    def dynamic(self) -> bool:
        return any(d < 0 for d in self.shape)


@dataclass(frozen=True)
class ShapeRange:
    """The input shapes one optimization profile accepts, bounds included."""

    min: Shape
    opt: Shape
    max: Shape

    @classmethod
    def fixed(cls, shape: Shape) -> "ShapeRange":
        return cls(tuple(shape), tuple(shape), tuple(shape))

    def contains(self, shape: Shape) -> bool:
        return len(shape) == len(self.min) and all(lo <= d <= hi for d, lo, hi in zip(shape, self.min, self.max))

    def text(self) -> str:
        return f"min {self.min} .. max {self.max}"


# One dict per optimization profile, in profile order: input name -> accepted shapes.
Profiles = Sequence[Mapping[str, ShapeRange]]


def check_io_names(path, config_inputs: Sequence[str], config_outputs: Sequence[str],
                   plan_inputs: Sequence[str], plan_outputs: Sequence[str]) -> None:
    """The config and the plan must agree: every plan input is fed, every config output exists."""
    problems = []
    unknown_inputs = [n for n in config_inputs if n not in plan_inputs]
    unfed_inputs = [n for n in plan_inputs if n not in config_inputs]
    unknown_outputs = [n for n in config_outputs if n not in plan_outputs]
    if unknown_inputs:
        problems.append(f"config inputs {unknown_inputs} are not inputs of the plan")
    if unfed_inputs:
        problems.append(f"plan inputs {unfed_inputs} are missing from the config (a plan needs every input)")
    if unknown_outputs:
        problems.append(f"config outputs {unknown_outputs} are not outputs of the plan")
    if problems:
        raise RuntimeLoadError(
            f"config and TensorRT plan {path} disagree: {'; '.join(problems)} "
            f"(plan inputs {list(plan_inputs)}, outputs {list(plan_outputs)})"
        )


def check_feed(feed: Mapping[str, np.ndarray], inputs: Mapping[str, PlanTensor]) -> Dict[str, Shape]:
    """Names, dtypes and ranks of one call's inputs; returns their shapes."""
    missing = [n for n in inputs if n not in feed]
    unknown = [n for n in feed if n not in inputs]
    if missing or unknown:
        raise ValueError(f"the plan takes inputs {list(inputs)}; missing {missing}, unknown {unknown}")
    shapes = {}
    for name, tensor in inputs.items():
        value = feed[name]
        if value.dtype != tensor.dtype:
            raise ValueError(f"input {name!r} is {value.dtype}; the plan takes {tensor.dtype}")
        if value.ndim != len(tensor.shape):
            raise ValueError(f"input {name!r} has shape {value.shape}; the plan takes rank {len(tensor.shape)} "
                             f"(engine shape {tensor.shape}, -1 = any size)")
        shapes[name] = tuple(int(d) for d in value.shape)
    return shapes


def choose_profile(shapes: Mapping[str, Shape], profiles: Profiles, preferred: int = 0) -> int:
    """The first optimization profile (starting with `preferred`) that accepts every input shape.

    `preferred` is the profile already active, so a steady stream of like shapes never
    switches profiles.
    """
    if not profiles:
        raise ValueError("the plan has no optimization profile")
    order = [preferred] + [i for i in range(len(profiles)) if i != preferred]
    for index in order:
        if all(profiles[index][name].contains(shape) for name, shape in shapes.items()):
            return index
    lines = []
    for name, shape in shapes.items():
        allowed = "; ".join(f"profile {i}: {p[name].text()}" for i, p in enumerate(profiles))
        if not any(p[name].contains(shape) for p in profiles):
            lines.append(f"input {name!r} shape {shape} is outside what the plan was built for ({allowed})")
    if not lines:
        lines.append("no single optimization profile accepts all input shapes together (" + "; ".join(
            f"{name} {shape}" for name, shape in shapes.items()) + ")")
    raise ValueError(
        "; ".join(lines) + ". Send smaller batches (max_batch_size at most the profile's largest batch) "
        "or rebuild the plan with a wider profile (trtexec --minShapes/--optShapes/--maxShapes)"
    )


def is_data_dependent(shape: Shape) -> bool:
    """An output whose size is only known after the engine ran (e.g. NonZero)."""
    return any(d < 0 for d in shape)


def output_nbytes(name: str, shape: Shape, dtype: np.dtype) -> int:
    """Bytes an output of `shape` needs once every input shape is set."""
    if is_data_dependent(shape):
        raise ValueError(f"output {name!r} has shape {shape} after all input shapes were set; "
                         f"its size depends on the data and is allocated while the engine runs")
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def allocation_nbytes(nbytes: int) -> int:
    """Device bytes to reserve for a tensor: TensorRT wants a real address even for empty tensors."""
    if nbytes < 0:
        raise ValueError(f"a tensor cannot need {nbytes} bytes")
    return max(int(nbytes), 1)


def cuda_device_problem(device: str, cuda_available: bool, device_count: int,
                        torch_cuda_version: Optional[str]) -> Optional[str]:
    """Why `device` cannot run a plan through torch's CUDA, or None when it can."""
    if not device.startswith("cuda"):
        return ("a TensorRT plan needs a GPU instance; set instance_group [{ kind: KIND_GPU }] "
                "in the model config")
    try:
        index = int(device.split(":", 1)[1]) if ":" in device else 0
    except ValueError:
        return f"device {device!r} is not of the form cuda:N"
    if torch_cuda_version is None:
        return ("the torch in the server's Python is a CPU-only build, and latte uses torch for GPU memory "
                "and streams; install a CUDA build of torch (https://pytorch.org/get-started/locally/)")
    if not cuda_available:
        return (f"torch (CUDA {torch_cuda_version}) sees no usable GPU; check the NVIDIA driver and that the "
                f"server's container was started with GPUs (docker --gpus, CUDA_VISIBLE_DEVICES)")
    if index >= device_count:
        return f"instance device {device} does not exist: {device_count} GPU(s) are visible to torch"
    return None


def describe_io(inputs: Mapping[str, PlanTensor], outputs: Mapping[str, PlanTensor], profiles: Profiles) -> Dict:
    """What auto-complete writes for a plan: tensors with Triton types, batching, the largest batch.

    A plan is batched when every IO tensor's first dimension is dynamic; its largest batch is
    the smallest first-dimension maximum any input allows in profile 0.
    """
    def tensors(group: Mapping[str, PlanTensor]):
        return [{"name": t.name, "data_type": to_triton(t.dtype), "dims": list(t.shape)} for t in group.values()]

    every = list(inputs.values()) + list(outputs.values())
    batched = bool(every) and all(t.shape and t.shape[0] == -1 for t in every)
    described = {"inputs": tensors(inputs), "outputs": tensors(outputs), "batched": batched}
    if batched and profiles and inputs:
        described["max_batch_size"] = min(profiles[0][name].max[0] for name in inputs)
    return described
