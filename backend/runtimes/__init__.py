"""Model runtimes behind one interface: `Runtime.run_batch(batch) -> (outputs, lengths)`
(base.py); a model runtime's `run(feed)` serves the accuracy gate."""

from latte.backend.runtimes.base import Runtime, RuntimeLoadError, load_runtime

__all__ = ["Runtime", "RuntimeLoadError", "load_runtime"]
