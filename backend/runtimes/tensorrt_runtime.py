"""TensorRT plans: available only where `tensorrt` imports and a CUDA device exists."""

from __future__ import annotations

from typing import Sequence

from latte.backend.runtimes.base import Runtime, RuntimeLoadError


class TensorRTRuntime(Runtime):
    kind = "tensorrt"

    def __init__(self, path, input_names: Sequence[str], output_names: Sequence[str], device: str = "cpu") -> None:
        super().__init__(input_names, output_names)
        try:
            import tensorrt  # noqa: F401
        except ImportError:
            raise RuntimeLoadError(
                f"{path} is a TensorRT plan, but the tensorrt package is not installed in the server's Python"
            ) from None
        if not device.startswith("cuda"):
            raise RuntimeLoadError(
                f"{path} is a TensorRT plan, which needs a GPU instance (instance_group kind: KIND_GPU)"
            )
        raise RuntimeLoadError("TensorRT plans are not supported by this version of latte yet")
