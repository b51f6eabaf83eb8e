"""Model runtimes behind one interface: `Runtime.run(feed) -> outputs`."""

from latte.backend.runtimes.base import Runtime, RuntimeLoadError, load_runtime

__all__ = ["Runtime", "RuntimeLoadError", "load_runtime"]
