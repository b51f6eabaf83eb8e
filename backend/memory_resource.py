"""The memory every buffer on the request path comes from: the process's current resource.

As RMM's `get_current_device_resource`, a model sets its arena once, when it loads (`use`),
and every allocation on the path (batch packing, a graph's intermediates, session state, a
stream's pools) asks for the current resource where it makes a buffer, instead of carrying an
`allocate` callable through each signature. Triton runs each model instance in a process of
its own, so the process's current resource is that instance's arena.

Serving from numpy's allocator is a choice made out loud: `use_numpy(reason)` makes it, and an
allocation with no resource set (a tool, a test, a benchmark in process) takes numpy's and
the log says so, once per process.
"""

from __future__ import annotations

import atexit
import logging
import threading
from typing import Callable, Optional

import numpy as np

Allocate = Callable[[tuple, np.dtype], np.ndarray]

_LOG = logging.getLogger("latte.memory")
_lock = threading.Lock()
# The allocate function every buffer on the path comes from; read on every allocation,
# written when a model loads and unloads. None: nothing chosen yet.
_current: Optional[Allocate] = None
_said = False  # whether the log was told that numpy's allocator serves


def _forget() -> None:
    # An arena still current at exit (a model never finalized) is let go before the
    # interpreter tears its types down.
    global _current
    _current = None


atexit.register(_forget)


def use(allocate: Allocate) -> None:
    """Make `allocate` the current resource (a model's arena, at load)."""
    global _current
    with _lock:
        _current = allocate


def use_numpy(reason: str) -> None:
    """Serve from numpy's allocator, on purpose; the log says why, once."""
    use(np.empty)
    _say(logging.INFO, f"buffers on the request path come from numpy's allocator: {reason}")


def _say(level: int, text: str) -> None:
    global _said
    if not _said:
        _said = True
        _LOG.log(level, text)


def empty(shape: tuple, dtype) -> np.ndarray:
    """An uninitialised host array from the current resource."""
    allocate = _current
    if allocate is None:
        _say(logging.WARNING, "no arena is current (memory_resource.use sets one); buffers on the request path come from "
             "numpy's allocator")
        allocate = _current_or_numpy()
    return allocate(shape, dtype)


def _current_or_numpy() -> Allocate:
    global _current
    with _lock:
        if _current is None:
            _current = np.empty
        return _current


def release(allocate: Allocate) -> None:
    """Nothing current once more, when `allocate` is (the model that set it unloads)."""
    global _current
    with _lock:
        if _current == allocate:
            _current = None
