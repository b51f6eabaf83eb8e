"""BuddyArena from Python: zero-copy arrays, block lifetime, statistics and errors."""

import gc
import threading

import numpy as np
import pytest

from latte import _native
from latte.memory import BuddyArena

MiB = 1 << 20


def test_empty_is_a_writable_view_of_arena_memory():
    arena = BuddyArena(4 * MiB)
    a = arena.empty((128, 64), np.float32)
    assert a.shape == (128, 64) and a.dtype == np.float32 and a.flags.c_contiguous
    a[:] = 3.0
    assert float(a.sum()) == 3.0 * 128 * 64
    assert a.ctypes.data % 256 == 0  # a buddy block (32 KiB request)
    stats = arena.stats()
    assert stats["live"] == 128 * 64 * 4
    assert stats["allocated"] == 128 * 64 * 4  # a multiple of the 256-byte unit: no rounding


def test_block_returns_when_the_last_view_dies():
    arena = BuddyArena(4 * MiB)
    a = arena.empty(1000, np.int64)
    tail = a[500:]  # a view keeps the block alive
    del a
    gc.collect()
    assert arena.stats()["live"] == 8000
    tail[:] = 7
    del tail
    gc.collect()
    stats = arena.stats()
    assert stats["live"] == 0 and stats["allocated"] == 0
    assert stats["allocations"] == 1 and stats["frees"] == 1


def test_block_is_reused_after_free():
    arena = BuddyArena(1 * MiB)
    address = arena.empty(300_000, np.uint8).ctypes.data  # freed at once
    again = arena.empty(300_000, np.uint8)
    assert again.ctypes.data == address


def test_arrays_outlive_the_arena_object():
    arena = BuddyArena(1 * MiB)
    a = arena.empty(10, np.float64)
    del arena
    gc.collect()
    a[:] = 1.5  # memory still mapped: the array holds the arena
    assert a.sum() == 15.0


def test_small_requests_use_size_classes():
    arena = BuddyArena(1 * MiB)
    keep = [arena.empty(n, np.uint8) for n in (1, 65, 700, 4000)]
    stats = arena.stats()
    assert stats["live"] == 1 + 65 + 700 + 4000
    assert stats["allocated"] == 64 + 128 + 768 + 4096
    assert all(k.ctypes.data % 64 == 0 for k in keep)


def test_zero_sized_and_scalar_shapes():
    arena = BuddyArena(1 * MiB)
    assert arena.empty((0, 5), np.float32).shape == (0, 5)
    assert arena.empty((), np.float64).shape == ()


def test_out_of_memory_is_memory_error_with_sizes():
    arena = BuddyArena(1 * MiB)
    hold = arena.empty(600_000, np.uint8)
    with pytest.raises(MemoryError, match=r"cannot allocate 600000 bytes: capacity 1048576"):
        arena.empty(600_000, np.uint8)
    assert arena.stats()["failures"] == 1
    del hold


def test_limit_forces_out_of_memory_below_capacity():
    arena = BuddyArena(4 * MiB, limit=1 * MiB)
    hold = arena.empty(MiB // 2, np.uint8)
    with pytest.raises(MemoryError, match="limit"):
        arena.empty(MiB, np.uint8)
    del hold


def test_fragmentation_is_reported():
    arena = BuddyArena(1 * MiB, size_classes=False)
    blocks = [arena.empty(64 * 1024, np.uint8) for _ in range(16)]
    del blocks[::2]  # every other 64 KiB block free: free space in 8 separate pieces
    gc.collect()
    stats = arena.stats()
    assert stats["free"] == 8 * 64 * 1024
    assert stats["largest_free_block"] == 64 * 1024
    assert stats["external_fragmentation"] == pytest.approx(1 - 1 / 8)


def test_empty_torch_shares_the_block():
    torch = pytest.importorskip("torch")
    arena = BuddyArena(1 * MiB)
    t = arena.empty_torch((4, 8), torch.bfloat16)
    assert t.dtype == torch.bfloat16 and t.shape == (4, 8)
    t.fill_(2.0)
    assert arena.stats()["live"] == 4 * 8 * 2
    del t
    gc.collect()
    assert arena.stats()["live"] == 0


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="capacity must be a positive"):
        BuddyArena(0)
    with pytest.raises(ValueError, match="min_block must be a power of two"):
        BuddyArena(1 * MiB, min_block=100)
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda"):
        BuddyArena(1 * MiB, device="tpu")
    arena = BuddyArena(1 * MiB)
    with pytest.raises(ValueError, match="negative"):
        arena.empty((2, -1))
    with pytest.raises(TypeError, match="shape must be"):
        arena.empty("big")
    with pytest.raises(TypeError, match="Python objects"):
        arena.empty(3, object)


@pytest.mark.skipif(_native.cuda_device_memory_compiled(), reason="this build has CUDA memory")
def test_cuda_arena_needs_a_cuda_build():
    with pytest.raises(ValueError, match="CUDA toolkit"):
        BuddyArena(1 * MiB, device="cuda")


def test_threads_share_one_arena():
    arena = BuddyArena(8 * MiB)
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(300):
                a = arena.empty(int(rng.integers(1, 50_000)), np.uint8)
                a[:] = seed
                if not (a == seed).all():
                    errors.append(f"block overwritten in thread {seed}")
        except MemoryError as e:  # pragma: no cover - would be a bug at this size
            errors.append(str(e))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    arena.check_invariants()
    assert arena.stats()["live"] == 0
