"""TensorRT plans on one GPU, with torch CUDA tensors as device buffers and a stream of their own.

Available where `tensorrt` imports and torch sees a CUDA device; everywhere else loading a
plan fails with a RuntimeLoadError that says what is missing. The rules a request must
meet (names, dtypes, optimization profile ranges) live in `tensorrt_io`, without tensorrt.
"""

from __future__ import annotations

import collections
import threading
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from latte.backend.runtimes.base import Runtime, RuntimeLoadError
from latte.backend.runtimes.tensorrt_io import (
    PlanTensor,
    ShapeRange,
    allocation_nbytes,
    check_feed,
    check_io_names,
    choose_profile,
    cuda_device_problem,
    describe_io,
    enum_name,
    is_data_dependent,
    numpy_dtype,
    output_nbytes,
    torch_dtype_name,
)


def import_tensorrt(path):
    try:
        import tensorrt
    except ImportError as exc:
        raise RuntimeLoadError(
            f"{path} is a TensorRT plan, but the tensorrt package does not import in the server's Python ({exc}); "
            f"install the TensorRT version that built the plan, e.g. pip install tensorrt==<version>"
        ) from None
    major = tensorrt.__version__.split(".", 1)[0]
    if not major.isdigit() or int(major) < 10:
        raise RuntimeLoadError(
            f"{path} is a TensorRT plan; latte serves plans through the TensorRT 10 API, but the server's Python "
            f"has tensorrt {tensorrt.__version__}; install tensorrt>=10 and rebuild the plan with it"
        )
    return tensorrt


def cuda_device(path, device: str):
    """torch with `device` checked usable; the index of that device."""
    import torch

    problem = cuda_device_problem(device, torch.cuda.is_available(), torch.cuda.device_count(), torch.version.cuda)
    if problem is not None:
        raise RuntimeLoadError(f"{path} is a TensorRT plan, but {problem}")
    return torch, torch.device(device).index or 0


def error_logger(trt):
    """A TensorRT logger that keeps the latest errors, so load failures can quote TensorRT's reason."""

    class ErrorLog(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors = collections.deque(maxlen=8)  # appends are atomic; TensorRT may log from any thread

        def log(self, severity, msg) -> None:
            if severity in (trt.ILogger.Severity.INTERNAL_ERROR, trt.ILogger.Severity.ERROR):
                self.errors.append(str(msg))

        def reason(self) -> str:
            return " | ".join(self.errors) or "TensorRT gave no reason"

    return ErrorLog()


def deserialize(trt, path, logger):
    try:
        plan = Path(path).read_bytes()
    except OSError as exc:
        raise RuntimeLoadError(f"cannot read TensorRT plan {path}: {exc}") from exc
    if not plan:
        raise RuntimeLoadError(f"TensorRT plan {path} is empty; rebuild it (trtexec --saveEngine={Path(path).name})")
    runtime = trt.Runtime(logger)
    try:
        engine = runtime.deserialize_cuda_engine(plan)
    except Exception as exc:  # some releases raise instead of returning None
        logger.errors.append(str(exc))
        engine = None
    if engine is None:
        raise RuntimeLoadError(
            f"TensorRT {trt.__version__} could not deserialize {path}: {logger.reason()}. A plan loads only with "
            f"the TensorRT version (and, unless built hardware-compatible, the GPU architecture) that built it; "
            f"rebuild it on this machine, e.g. trtexec --onnx=model.onnx --saveEngine=model.plan"
        )
    return runtime, engine


def plan_tensors(trt, engine, path):
    """The engine's IO tensors as (inputs, outputs), in engine order."""
    inputs: Dict[str, PlanTensor] = {}
    outputs: Dict[str, PlanTensor] = {}
    for index in range(engine.num_io_tensors):
        name = engine.get_tensor_name(index)
        if engine.get_tensor_location(name) != trt.TensorLocation.DEVICE:
            raise RuntimeLoadError(
                f"plan tensor {name!r} of {path} lives in host memory (a shape tensor); latte serves plans whose "
                f"inputs and outputs are device tensors"
            )
        layout = engine.get_tensor_format(name)
        if layout != trt.TensorFormat.LINEAR:
            raise RuntimeLoadError(
                f"plan tensor {name!r} of {path} uses the vectorized layout {enum_name(layout)}; rebuild the plan "
                f"with linear IO, e.g. trtexec --inputIOFormats=fp32:chw --outputIOFormats=fp32:chw"
            )
        tensor = PlanTensor(name, numpy_dtype(enum_name(engine.get_tensor_dtype(name)), name),
                            tuple(int(d) for d in engine.get_tensor_shape(name)))
        if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
            inputs[name] = tensor
        else:
            outputs[name] = tensor
    return inputs, outputs


def profile_ranges(engine, inputs: Dict[str, PlanTensor]) -> List[Dict[str, ShapeRange]]:
    profiles = []
    for index in range(max(1, engine.num_optimization_profiles)):
        ranges = {}
        for name, tensor in inputs.items():
            if tensor.dynamic:
                low, best, high = (tuple(int(d) for d in dims) for dims in engine.get_tensor_profile_shape(name, index))
                ranges[name] = ShapeRange(low, best, high)
            else:
                ranges[name] = ShapeRange.fixed(tensor.shape)
        profiles.append(ranges)
    return profiles


def data_dependent_allocator(trt, torch, device):
    """Device memory for outputs whose size TensorRT learns only while the engine runs."""

    class OutputBuffers(trt.IOutputAllocator):
        def __init__(self) -> None:
            trt.IOutputAllocator.__init__(self)
            self.buffers: Dict[str, object] = {}
            self.shapes: Dict[str, tuple] = {}

        def reallocate_output(self, tensor_name, memory, size, alignment):
            return self.reallocate_output_async(tensor_name, memory, size, alignment, None)

        def reallocate_output_async(self, tensor_name, memory, size, alignment, stream):
            # Called inside execute_async_v3, on the runtime's stream, with torch's current stream set to it.
            current = self.buffers.get(tensor_name)
            if current is None or current.numel() < size:
                current = torch.empty(allocation_nbytes(size), dtype=torch.uint8, device=device)
                self.buffers[tensor_name] = current
            return current.data_ptr()

        def notify_shape(self, tensor_name, shape):
            self.shapes[tensor_name] = tuple(int(d) for d in shape)

    return OutputBuffers()


def typed_buffer(torch, dtype, shape, nbytes: int, device):
    """A tensor of `shape` over a fresh allocation of at least one byte (TensorRT wants real addresses).

    torch's caching allocator makes one allocation per call cheap.
    """
    itemsize = torch.empty(0, dtype=dtype).element_size()
    elements = -(-allocation_nbytes(nbytes) // itemsize)
    return torch.empty(elements, dtype=dtype, device=device)[:nbytes // itemsize].view(shape)


def device_address(tensor) -> int:
    """Where a tensor's memory starts; torch reports 0 for tensors without elements, TensorRT wants the allocation."""
    return tensor.data_ptr() or tensor.untyped_storage().data_ptr()


def bytes_as(buffer, dtype, shape, nbytes: int):
    """The first `nbytes` of a uint8 buffer seen as a tensor of `dtype` and `shape`."""
    return buffer[:nbytes].view(dtype).view(shape)


class TensorRTRuntime(Runtime):
    kind = "tensorrt"

    def __init__(self, path, input_names: Sequence[str], output_names: Sequence[str], device: str = "cpu") -> None:
        super().__init__(input_names, output_names)
        self.path = path
        if not device.startswith("cuda"):
            raise RuntimeLoadError(f"{path} is a TensorRT plan, but {cuda_device_problem(device, False, 0, None)}")
        trt = import_tensorrt(path)
        torch, index = cuda_device(path, device)
        self._trt, self._torch = trt, torch
        self.device = torch.device("cuda", index)
        self._logger = error_logger(trt)
        # One call at a time: an execution context holds the shapes and addresses of the call it runs.
        self._lock = threading.Lock()
        with torch.cuda.device(self.device):
            self._runtime, self._engine = deserialize(trt, path, self._logger)
            self.inputs, self.outputs = plan_tensors(trt, self._engine, path)
            check_io_names(path, input_names, output_names, list(self.inputs), list(self.outputs))
            self.profiles = profile_ranges(self._engine, self.inputs)
            self._context = self._engine.create_execution_context()
            if self._context is None:
                raise RuntimeLoadError(
                    f"TensorRT could not create an execution context for {path} on {device}: {self._logger.reason()} "
                    f"(often too little free GPU memory for the plan's activations)"
                )
            self._stream = torch.cuda.Stream(device=self.device)
        self._active_profile = 0
        self._allocator = None
        self._allocated_outputs: set = set()
        self._torch_dtypes = {name: getattr(torch, torch_dtype_name(t.dtype))
                              for name, t in {**self.inputs, **self.outputs}.items()}

    def run(self, feed: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        shapes = check_feed(feed, self.inputs)
        with self._lock:
            if self._context is None:
                raise RuntimeError(f"the TensorRT runtime for {self.path} is closed")
            self._logger.errors.clear()  # so a failure quotes this call's reason only
            profile = choose_profile(shapes, self.profiles, self._active_profile)
            # The device is per host thread: scheduler lanes are threads of their own.
            with self._torch.cuda.device(self.device), self._torch.cuda.stream(self._stream):
                return self._run_on_stream(feed, shapes, profile)

    def _run_on_stream(self, feed, shapes, profile) -> Dict[str, np.ndarray]:
        context, stream = self._context, self._stream
        if profile != self._active_profile:
            context.set_optimization_profile_async(profile, stream.cuda_stream)
            self._active_profile = profile
        staged = self._stage_inputs(feed, shapes)  # referenced until the stream is done with them
        device_outputs = self._bind_outputs()
        if not context.execute_async_v3(stream.cuda_stream):
            stream.synchronize()
            raise RuntimeError(f"TensorRT failed to run {self.path}: {self._logger.reason()}")
        self._reported_outputs(device_outputs)
        copies = {}
        for name in self.output_names:
            source = device_outputs[name]
            host = self._torch.empty(source.shape, dtype=source.dtype, pin_memory=True)
            host.copy_(source, non_blocking=True)
            copies[name] = host
        stream.synchronize()
        del staged
        return {name: host.numpy() for name, host in copies.items()}

    def _stage_inputs(self, feed, shapes) -> list:
        """Each input copied to its device buffer and bound: (host, device) tensors."""
        torch, context = self._torch, self._context
        staged = []
        for name, shape in shapes.items():
            host = feed[name]
            if not host.flags.writeable:
                host = host.copy()  # torch.from_numpy warns on read-only memory it cannot own
            source = torch.from_numpy(np.ascontiguousarray(host))
            target = self._device_tensor(name, shape, source.nbytes)
            target.copy_(source, non_blocking=True)
            if not context.set_input_shape(name, shape):
                raise ValueError(f"TensorRT rejected shape {shape} for input {name!r}: {self._logger.reason()}")
            context.set_tensor_address(name, device_address(target))
            staged.append((source, target))
        return staged

    def _bind_outputs(self) -> dict:
        """A device buffer bound for each output whose shape the inputs' shapes fix; the others
        are allocated while the engine runs."""
        context = self._context
        device_outputs = {}
        for name, tensor in self.outputs.items():
            shape = tuple(int(d) for d in context.get_tensor_shape(name))
            if is_data_dependent(shape):
                self._allocate_while_running(name)
                continue
            target = self._device_tensor(name, shape, output_nbytes(name, shape, tensor.dtype))
            context.set_tensor_address(name, device_address(target))
            device_outputs[name] = target
        return device_outputs

    def _reported_outputs(self, device_outputs: dict) -> None:
        """The outputs whose shapes depend on the data, as TensorRT reported them."""
        for name in self._allocated_outputs:
            # TensorRT reported these shapes before execute_async_v3 returned; the stream orders the reads after it.
            shape = self._allocator.shapes.get(name)
            if shape is None:
                raise RuntimeError(f"TensorRT ran {self.path} without reporting the shape of output {name!r}")
            nbytes = output_nbytes(name, shape, self.outputs[name].dtype)
            if nbytes == 0:  # TensorRT need not ask for memory for an empty result
                device_outputs[name] = self._torch.empty(shape, dtype=self._torch_dtypes[name], device=self.device)
                continue
            device_outputs[name] = bytes_as(self._allocator.buffers[name], self._torch_dtypes[name], shape, nbytes)

    def _device_tensor(self, name: str, shape, nbytes: int):
        return typed_buffer(self._torch, self._torch_dtypes[name], shape, nbytes, self.device)

    def _allocate_while_running(self, name: str) -> None:
        if self._allocator is None:
            self._allocator = data_dependent_allocator(self._trt, self._torch, self.device)
        if name not in self._allocated_outputs:
            if not self._context.set_output_allocator(name, self._allocator):
                raise RuntimeError(f"TensorRT refused an output allocator for {name!r}: {self._logger.reason()}")
            self._allocated_outputs.add(name)

    def close(self) -> None:
        with self._lock:
            if self._context is None:
                return
            self._stream.synchronize()
            # Context before engine before runtime: each needs the one it came from.
            self._context = None
            self._engine = None
            self._runtime = None
            self._allocator = None


def describe_plan(path, device: str = "cuda:0") -> Optional[Dict]:
    """The plan's IO for auto-complete, or None where tensorrt or a GPU is missing."""
    try:
        trt = import_tensorrt(path)
        torch, index = cuda_device(path, device)
    except RuntimeLoadError:
        return None
    logger = error_logger(trt)
    with torch.cuda.device(index):
        runtime, engine = deserialize(trt, path, logger)
        inputs, outputs = plan_tensors(trt, engine, path)
        profiles = profile_ranges(engine, inputs)
        del engine, runtime
    return describe_io(inputs, outputs, profiles)
