"""TorchScript (`torch.jit.save`) and torch.export (`torch.export.save`, .pt2) programs."""

from __future__ import annotations

import threading
from typing import Dict, Sequence

import numpy as np

from latte.backend.runtimes.base import Runtime, RuntimeLoadError

_threads_set = False
_lane = threading.local()


def set_torch_threads(intra: int, inter: int) -> None:
    """Apply the thread budget once per process (torch allows inter-op only once)."""
    global _threads_set
    import torch

    torch.set_num_threads(intra)
    if not _threads_set:
        try:
            torch.set_num_interop_threads(inter)
        except RuntimeError:
            pass  # inter-op pool already started by earlier work in this process
        _threads_set = True


class TorchRuntime(Runtime):
    def __init__(self, kind: str, path, input_names: Sequence[str], output_names: Sequence[str],
                 intra_op_threads: int, inter_op_threads: int, device: str = "cpu", half: bool = False,
                 freeze: bool = True) -> None:
        super().__init__(input_names, output_names)
        import torch

        self.kind = kind
        self._torch = torch
        set_torch_threads(intra_op_threads, inter_op_threads)
        self.device = torch.device(device)
        try:
            if kind == "torchscript":
                module = torch.jit.load(str(path), map_location=self.device)
                module.eval()
            else:
                module = torch.export.load(str(path)).module()
                module.to(self.device)
        except Exception as exc:
            raise RuntimeLoadError(f"torch could not load {path}: {exc}") from exc
        self.intra_op_threads = intra_op_threads
        # On the CPU a tensor from numpy is where it runs already: no move in, none out (each is
        # a dispatcher call, and a one-stream decode makes a dozen of them per token).
        self._on_cpu = self.device.type == "cpu"
        # torch.inference_mode's own guard: the same mode with no Python frames around it, which
        # a call made for every request or token pays for (torch.inference_mode where a torch
        # has none).
        self._inference_mode = getattr(torch._C, "_InferenceMode", None) or torch.inference_mode
        self.half = half
        if half:
            module = module.half()
        if kind == "torchscript" and freeze:
            module = self._frozen(module)
        self.module = module
        self._arg_order = self._argument_order(module, list(input_names))
        self._loading_thread = threading.get_ident()

    def _frozen(self, module):
        """The module frozen for inference: its weights and attributes folded into the graph as
        constants, so a call looks none of them up (measured in process, one thread: the
        streaming examples' decode 14-25 % and prefill 30 % faster at 16 streams). Only the
        passes that keep results bit for bit run. Where torch cannot freeze the module, it
        runs as loaded and the log says why."""
        try:
            return self._torch.jit.freeze(module, optimize_numerics=False)
        except Exception as exc:
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            self.notes.append(f"TorchScript runs unfrozen (torch.jit.freeze: {reason})")
            return module

    @staticmethod
    def _argument_order(module, names):
        # Map config input names onto forward()'s parameters when they match by name;
        # otherwise feed them positionally in config order.
        try:
            schema = module.forward.schema  # TorchScript
            params = [a.name for a in schema.arguments][1:]
        except AttributeError:
            import inspect

            try:
                params = [p for p in inspect.signature(module.forward).parameters]
            except (TypeError, ValueError):
                params = []
        if set(names) <= set(params):
            return [p for p in params if p in names]
        return names

    def _enter_thread(self) -> None:
        """Once per thread and device: the thread's CUDA stream. The thread that loaded the model
        (the stub's, which serves one call at a time) keeps the device's default stream; any
        other thread that runs it (a scheduler lane, a branch or stream runner) gets a stream of
        its own, made its current stream for good, so that lanes' copies and kernels do not queue
        behind one another's and no call pays for entering and leaving a stream context (an
        H200, one request at a time: 50-100 us a call, 10-25 % of a small model's)."""
        torch = self._torch
        streams = getattr(_lane, "streams", None)
        if streams is None:
            streams = _lane.streams = {}
        if threading.get_ident() == self._loading_thread:
            streams[self.device] = None
            return
        stream = torch.cuda.Stream(device=self.device)
        # The weights were copied on the default stream at load: work on this one follows them.
        stream.wait_stream(torch.cuda.default_stream(self.device))
        torch.cuda.set_stream(stream)
        streams[self.device] = stream

    def run(self, feed: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        return self._on_lane(feed, to_host=True)

    takes_tensors = True

    def run_tensors(self, feed) -> Dict[str, "object"]:
        """The outputs as torch tensors on this runtime's device; the feed may hold numpy arrays
        or tensors (a graph passes the tensors one torch step made to the next, so on a GPU
        they stay on the device)."""
        return self._on_lane(feed, to_host=False)

    def _on_lane(self, feed, to_host: bool):
        if getattr(_lane, "threads", None) != self.intra_op_threads:
            # OpenMP's thread count is per calling thread: scheduler lanes set their own.
            self._torch.set_num_threads(self.intra_op_threads)
            _lane.threads = self.intra_op_threads
        if self._on_cpu:
            outputs = self._run_on_current_stream(feed)
            if to_host:  # made under inference_mode: only a returned weight needs detaching
                return {name: (t.detach() if t.requires_grad else t).numpy() for name, t in outputs.items()}
            return outputs
        if self.device not in getattr(_lane, "streams", ()):
            self._enter_thread()
        outputs = self._run_on_current_stream(feed)
        if to_host:  # copied on the thread's stream, after the kernels that made them
            return {name: t.detach().to("cpu").numpy() for name, t in outputs.items()}
        return outputs

    def _tensor(self, value):
        torch = self._torch
        if isinstance(value, torch.Tensor):
            return value if self._on_cpu else value.to(self.device)
        tensor = torch.from_numpy(np.ascontiguousarray(value))
        return tensor if self._on_cpu else tensor.to(self.device)

    def _run_on_current_stream(self, feed) -> Dict[str, "object"]:
        torch = self._torch
        args = [self._tensor(feed[name]) for name in self._arg_order]
        if self.half:
            args = [a.half() if a.is_floating_point() else a for a in args]
        with self._inference_mode(True):
            result = self.module(*args)
        if isinstance(result, torch.Tensor):
            result = (result,)
        elif isinstance(result, dict):
            result = tuple(result[name] for name in self.output_names)
        if len(result) != len(self.output_names):
            raise RuntimeError(f"model returned {len(result)} outputs; the config declares {len(self.output_names)}")
        if not self.half:
            return dict(zip(self.output_names, result))
        return {name: (t.float() if t.is_floating_point() else t) for name, t in zip(self.output_names, result)}
