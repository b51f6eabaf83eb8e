"""Latte's memory arena: a buddy allocator over one pre-reserved region.

Arrays from :meth:`BuddyArena.empty` are zero-copy views of arena blocks; a block goes back
to the arena when the last reference to its array (or any view of it) dies. See
docs/memory.md for the design and its trade-offs.
"""

from __future__ import annotations

import math
import operator
import warnings
from pathlib import Path
from typing import Any, Sequence, Union

import numpy as np

from latte._native import BuddyArena as _NativeArena
from latte._native import DEVICE_IDLE_SHARE, cuda_device_memory_compiled, cuda_runtime_available

__all__ = [
    "BuddyArena",
    "DEVICE_IDLE_SHARE",
    "cuda_device_memory_compiled",
    "cuda_runtime_available",
    "torch_allocator_library",
    "torch_arena_check",
    "torch_arena_statistics",
    "torch_pluggable_allocator",
    "torch_mem_pool",
]

Shape = Union[int, Sequence[int]]


def _normalize_shape(shape: Shape) -> tuple[int, ...]:
    try:
        dims = (operator.index(shape),)
    except TypeError:
        try:
            dims = tuple(operator.index(d) for d in shape)
        except TypeError:
            raise TypeError(f"shape must be an int or a sequence of ints, got {shape!r}") from None
    if any(d < 0 for d in dims):
        raise ValueError(f"shape must not have negative dimensions, got {dims}")
    return dims


class BuddyArena(_NativeArena):
    """A fixed-capacity arena; allocation never touches the operating system.

    capacity: bytes reserved up front (rounded down to ``min_block``).
    device: ``"cpu"`` (mmap'd, pre-faulted, pinned when a CUDA device exists) or ``"cuda[:N]"``
        (one cudaMalloc'd region; needs a CUDA build and device).
    limit: optional byte limit below the capacity; requests beyond it raise MemoryError.
    paged: the buddy carves a reserved range of addresses ``4x`` the capacity and physical
        pages of ``page_bytes`` (on the host a memfd's, hugetlb where the machine has the huge
        pages; on a CUDA device the driver's, cuMemCreate / cuMemMap, with ``page_bytes``
        rounded up to the device's granularity) are mapped under each block as it is taken,
        so a large block needs no contiguous physical memory: a request fails only when live pages plus its own exceed
        the capacity. Freed pages stay mapped and are reused without a system call; they are
        unmapped when another range needs them (see ``idle_share``), or by
        ``release_cached()``. Where the machine cannot map pages the plain buddy serves, with a
        warning naming the reason (``fallback_reason``).
    idle_share: paged only. Idle pages kept beyond the pages in use are at most that
        many / ``idle_share``; past it, a range's missing pages come from the oldest idle ones
        (unmapped and mapped again) instead of memory not yet held. 0 keeps every idle page
        until the capacity runs out. None: the pages' own, 0 on the host (a remapped page
        is faulted in again) and 2 on a CUDA device (device memory is what runs short; each
        eviction waits for the device).

    Inherited from the native class (no Python frame on the hot path):
    ``empty(shape, dtype)`` -- an uninitialised C-contiguous numpy array over an arena block,
    returned to the arena when the last reference to it or a view of it dies;
    ``stats()`` -- capacity, reserved, live (requested) and allocated (rounded) bytes, peaks,
    internal/external fragmentation, counts of allocations, frees and failures, and the
    figures that can alarm: the largest free block against the P99 request seen, ``fragmented``
    and ``fragmentation_failures`` (see docs/memory.md);
    ``check_invariants()`` -- raises ValueError naming a broken invariant (do not run it
    concurrently with allocations from other threads);
    ``release_cached()`` -- returns cached empty slabs to the buddy lists and, paged, unmaps
    idle pages and gives their memory back to the system.
    """

    def __init__(
        self,
        capacity: int,
        device: str = "cpu",
        *,
        min_block: int = 256,
        limit: int | None = None,
        size_classes: bool = True,
        prefault: bool = True,
        paged: bool = False,
        page_bytes: int = 1 << 20,
        idle_share: int | None = None,
    ) -> None:
        capacity = operator.index(capacity)
        if capacity <= 0:
            raise ValueError(f"capacity must be a positive number of bytes, got {capacity}")
        if not isinstance(device, str):
            raise TypeError(f"device must be a string such as 'cpu' or 'cuda:0', got {device!r}")
        if limit is not None and operator.index(limit) <= 0:
            raise ValueError(f"limit must be a positive number of bytes or None, got {limit}")
        if idle_share is not None and not 0 <= operator.index(idle_share) < 2**31:
            raise ValueError(f"idle_share must be 0 (keep every idle page) or a divisor below 2**31, got {idle_share}")
        super().__init__(capacity, device, min_block, limit, size_classes, prefault, paged, page_bytes, idle_share)
        if self.fallback_reason:
            warnings.warn(f"BuddyArena: paged arena unavailable, the plain buddy serves: {self.fallback_reason}",
                          RuntimeWarning, stacklevel=2)

    def empty_torch(self, shape: Shape, dtype: Any = None) -> Any:
        """Like :meth:`empty` but a CPU torch tensor (sharing the block, no copy)."""
        import torch

        dtype = torch.float32 if dtype is None else dtype
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
        dims = _normalize_shape(shape)
        raw = self.empty(math.prod(dims) * dtype.itemsize, np.uint8)
        return torch.from_numpy(raw).view(dtype).reshape(dims)

    def __repr__(self) -> str:
        s = self.stats()
        return f"BuddyArena(capacity={s['capacity']}, device={self.device!r}, live={s['live']})"


def torch_allocator_library() -> Path:
    """Path of the shared library exporting latte_malloc/latte_free (CUDA builds only)."""
    path = Path(__file__).resolve().parent / "liblatte_torch_allocator.so"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: Latte was built without the CUDA toolkit, so there is no "
            "PyTorch allocator plug-in (rebuild on a machine with nvcc / CUDA headers)"
        )
    return path


# The figures latte_arena_figures fills, in its order (csrc/src/memory/torch_allocator_plugin.cpp).
TORCH_ARENA_FIGURES = ("capacity", "live", "allocated", "peak_live", "peak_allocated", "largest_free_block",
                       "allocations", "failures", "fragmentation_failures",
                       "page_bytes", "physical_held", "mapped", "map_calls", "unmap_calls")


def _plugin() -> Any:
    import ctypes

    lib = ctypes.CDLL(str(torch_allocator_library()))
    lib.latte_arena_figures.restype = ctypes.c_int
    lib.latte_arena_figures.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_int]
    lib.latte_arena_check.restype = ctypes.c_int
    lib.latte_arena_check.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    return lib


def torch_arena_statistics(device: int = 0) -> dict | None:
    """The plug-in's arena on `device` (bytes and counts; see TORCH_ARENA_FIGURES), or None before
    its first allocation. torch.cuda.memory_stats() cannot see inside a pluggable allocator."""
    import ctypes

    values = (ctypes.c_ulonglong * len(TORCH_ARENA_FIGURES))()
    if _plugin().latte_arena_figures(int(device), values, len(values)) != 0:
        return None
    return dict(zip(TORCH_ARENA_FIGURES, (int(v) for v in values)))


def torch_arena_check(device: int = 0) -> None:
    """Walks the plug-in arena's bookkeeping on `device`; raises ValueError naming a broken
    invariant. Not concurrent with allocations; a device without an arena yet passes."""
    import ctypes

    message = ctypes.create_string_buffer(512)
    if _plugin().latte_arena_check(int(device), message, len(message)) == 1:
        raise ValueError(message.value.decode(errors="replace"))


def torch_pluggable_allocator() -> Any:
    """A torch.cuda.memory.CUDAPluggableAllocator backed by one BuddyArena per device.

    Install it process-wide, before any CUDA tensor exists, with
    ``torch.cuda.memory.change_current_allocator(torch_pluggable_allocator())``; the arena's
    capacity comes from LATTE_CUDA_ARENA_BYTES (default: 80% of the device's free memory), and
    LATTE_CUDA_ARENA_PAGES=1 makes it a paged arena over the driver's pages (``paged=True``).
    A request the arena refuses raises RuntimeError("CUDA out of memory: latte device arena ...")
    in the caller, naming what was short.
    """
    import torch

    return torch.cuda.memory.CUDAPluggableAllocator(str(torch_allocator_library()), "latte_torch_malloc",
                                                     "latte_free")


def torch_mem_pool() -> Any:
    """A torch.cuda.MemPool (torch >= 2.5) served by the arena, for use as
    ``with torch.cuda.use_mem_pool(pool): ...`` while the default allocator serves the rest."""
    import torch

    if not hasattr(torch.cuda, "MemPool"):
        raise RuntimeError(f"torch.cuda.MemPool needs torch >= 2.5, this is torch {torch.__version__}")
    # The pool's caching allocator takes a null pointer as a refusal: it frees its cached blocks,
    # tries again, and raises torch.OutOfMemoryError.
    refusing_with_null = torch.cuda.memory.CUDAPluggableAllocator(str(torch_allocator_library()), "latte_malloc",
                                                                  "latte_free")
    return torch.cuda.MemPool(refusing_with_null.allocator())
