"""The memory every buffer on the request path comes from: the current resource of a device.

As RMM's `get_current_device_resource`, a model sets its arena once, when it loads
(`use`), and every allocation on the path (batch packing, a graph's intermediates, session
state) asks for the current resource where it makes a buffer, instead of carrying an
`allocate` callable through each signature, where leaving it out fell back to `np.empty`
without a word. Triton runs each model instance in a process of its own, so the process's
current resource is that instance's arena. Until a model sets one, the resource is numpy's
own allocator.
"""

from __future__ import annotations

import atexit
import threading
from typing import Callable, Dict

import numpy as np

Allocate = Callable[[tuple, np.dtype], np.ndarray]

_lock = threading.Lock()
# device -> its allocate function; read on every allocation, written when a model loads.
_current: Dict[str, Allocate] = {}
# An arena still current at exit (a model never finalized) is let go before the interpreter
# tears its types down.
atexit.register(_current.clear)


def use(allocate: Allocate, device: str = "cpu") -> None:
    """Make `allocate` the current resource of `device` (a model's arena, at load)."""
    with _lock:
        _current[device] = allocate


def empty(shape: tuple, dtype) -> np.ndarray:
    """An uninitialised host array from the current resource."""
    return _current.get("cpu", np.empty)(shape, dtype)


def release(allocate: Allocate, device: str = "cpu") -> None:
    """Back to numpy's allocator when `allocate` is current (the model that set it unloads)."""
    with _lock:
        if _current.get(device) == allocate:
            del _current[device]
