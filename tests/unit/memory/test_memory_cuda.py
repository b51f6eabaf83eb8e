"""CUDA pieces: the device arena and the PyTorch allocator plug-in.

Without the CUDA toolkit at build time they are absent (tests skip); without a GPU they must
refuse cleanly rather than crash; with a GPU they serve real allocations.
"""

import ctypes

import pytest

from latte import _native
from latte.memory import (TORCH_ARENA_FIGURES, BuddyArena, torch_allocator_library, torch_arena_check,
                          torch_arena_statistics)

needs_cuda_build = pytest.mark.skipif(not _native.cuda_device_memory_compiled(), reason="built without the CUDA toolkit")


def _gpu_present() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@needs_cuda_build
def test_plugin_exports_the_pluggable_allocator_symbols():
    lib = ctypes.CDLL(str(torch_allocator_library()))
    lib.latte_malloc.restype = ctypes.c_void_p
    lib.latte_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.latte_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    ptr = lib.latte_malloc(1 << 20, 0, None)
    if _gpu_present():
        assert ptr is not None and ptr % 256 == 0
    else:
        assert ptr is None  # no device: a null pointer (PyTorch reports OOM), not a crash
    lib.latte_free(ptr, 1 << 20, 0, None)


@pytest.mark.gpu  # also runs without a device, where there is no arena to read
@needs_cuda_build
def test_arena_figures_exist_once_the_device_has_an_arena():
    assert torch_arena_statistics(63) is None          # no arena was made for this device
    torch_arena_check(63)                              # nothing to walk: passes
    lib = ctypes.CDLL(str(torch_allocator_library()))
    lib.latte_malloc.restype = ctypes.c_void_p
    lib.latte_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.latte_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    ptr = lib.latte_malloc(3 << 20, 0, None)
    figures = torch_arena_statistics(0)
    if not _gpu_present():
        assert ptr is None and figures is None         # no device, no arena
        return
    assert set(figures) == set(TORCH_ARENA_FIGURES)
    assert figures["live"] >= 3 << 20 and figures["allocations"] >= 1 and figures["failures"] == 0
    lib.latte_free(ptr, 3 << 20, 0, None)
    torch_arena_check(0)
    assert torch_arena_statistics(0)["live"] == figures["live"] - (3 << 20)


@needs_cuda_build
@pytest.mark.skipif(_gpu_present(), reason="a GPU is present")
def test_cuda_arena_without_a_device_is_a_clear_error():
    with pytest.raises(ValueError, match="CUDA"):
        BuddyArena(1 << 20, device="cuda")


@pytest.mark.skipif(_native.cuda_device_memory_compiled(), reason="this build has the plug-in")
def test_missing_plugin_says_why():
    with pytest.raises(FileNotFoundError, match="without the CUDA toolkit"):
        torch_allocator_library()


@pytest.mark.gpu
@needs_cuda_build
@pytest.mark.skipif(not _gpu_present(), reason="needs a CUDA device")
def test_mem_pool_serves_tensors_from_the_arena():
    import torch

    from latte.memory import torch_mem_pool

    pool = torch_mem_pool()
    with torch.cuda.use_mem_pool(pool):
        x = torch.ones(1024, 1024, device="cuda")
    assert float(x.sum()) == 1024 * 1024
    del x
    torch.cuda.synchronize()


@pytest.mark.gpu
@needs_cuda_build
@pytest.mark.skipif(not _gpu_present(), reason="needs a CUDA device")
def test_device_arena_reports_statistics():
    arena = BuddyArena(64 << 20, device="cuda:0")
    assert arena.device == "cuda:0"
    with pytest.raises(ValueError, match="cpu"):
        arena.empty(16)
    assert arena.stats()["capacity"] == 64 << 20


@needs_cuda_build
@pytest.mark.skipif(_gpu_present(), reason="a GPU is present")
def test_a_paged_device_arena_without_a_device_is_a_clear_error():
    with pytest.raises(ValueError, match="no usable CUDA runtime/driver"):
        BuddyArena(64 << 20, device="cuda", paged=True)


@pytest.mark.gpu
@needs_cuda_build
@pytest.mark.skipif(not _gpu_present(), reason="needs a CUDA device")
def test_a_paged_device_arena_maps_the_drivers_pages():
    arena = BuddyArena(64 << 20, device="cuda:0", paged=True)
    stats = arena.stats()
    assert stats["paged"] and arena.page_kind == "cuda" and stats["page_bytes"] >= 2 << 20
    assert arena.fallback_reason == ""


# Through PyTorch: 24 tensors of 2 MiB fill 48 MiB of a 64 MiB arena, every other one is freed,
# then one 20 MiB tensor is asked for. 40 MiB are free, but no 32 MiB buddy block is.
_CHECKERBOARD = """
import json, torch
from latte.memory import torch_arena_check, torch_arena_statistics, torch_pluggable_allocator
torch.cuda.memory.change_current_allocator(torch_pluggable_allocator())
floats = (2 << 20) // 4
tensors = [torch.full((floats,), float(i), device="cuda") for i in range(24)]
kept = tensors[1::2]
del tensors
refusal = ""
try:
    big = torch.ones(10 * floats, device="cuda")
    big_sum = float(big.sum())
except RuntimeError as error:
    big_sum, refusal = None, str(error)
sums = [float(t.sum()) / floats for t in kept]
torch.cuda.synchronize()
torch_arena_check(0)
print(json.dumps({"big_sum": big_sum, "refusal": refusal, "sums": sums, "figures": torch_arena_statistics(0)}))
"""


def _checkerboard(paged: bool) -> dict:
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "LATTE_CUDA_ARENA_BYTES": str(64 << 20), "LATTE_CUDA_ARENA_PAGES": "1" if paged else "0"}
    done = subprocess.run([sys.executable, "-c", _CHECKERBOARD], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.gpu
@needs_cuda_build
@pytest.mark.skipif(not _gpu_present(), reason="needs a CUDA device")
def test_a_paged_device_arena_serves_torch_a_block_the_plain_buddy_has_no_room_for():
    plain, paged = _checkerboard(paged=False), _checkerboard(paged=True)
    assert plain["big_sum"] is None and plain["figures"]["failures"] >= 1 and plain["figures"]["page_bytes"] == 0
    # Refused with an error that says so, and the device stays usable: the kept tensors read back.
    assert plain["refusal"].startswith("CUDA out of memory: latte device arena on device 0: BuddyArena: cannot allocate")
    assert plain["sums"] == [float(i) for i in range(1, 24, 2)]
    assert paged["big_sum"] == 10 * (2 << 20) // 4
    assert paged["sums"] == [float(i) for i in range(1, 24, 2)]      # the kept tensors' pages stayed theirs
    figures = paged["figures"]
    assert figures["failures"] == 0 and figures["page_bytes"] >= 2 << 20 and figures["map_calls"] >= 1
    # Pages for the live 44 MiB, within the 64 MiB the arena may hold: the 20 MiB block spans 32 MiB
    # of addresses but is backed by 20 MiB of pages.
    assert 44 << 20 <= figures["physical_held"] <= 64 << 20 and figures["live"] == 44 << 20
