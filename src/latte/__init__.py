"""Latte: a Triton Inference Server backend with a buddy-allocator arena and a
locality-aware scheduler, plus a generator for model repositories."""

__version__ = "0.1.0"

__all__ = ["__version__"]
