"""How torch holds a GPU instance's memory, chosen per model (parameters device_allocator).

A Python-backend instance is a process of its own, so the choice is process-wide and made
before the model's first CUDA tensor: `caching` is PyTorch's own allocator, `expandable` the
same with expandable_segments, `arena` latte's buddy arena as PyTorch's pluggable allocator
(capacity device_arena_bytes, taken from the device in one allocation at the first tensor).
The figures are published as latte_device_memory_bytes (docs/backend.md, Metrics).
"""

from __future__ import annotations

import os
from typing import Dict, Optional, Tuple

from latte.backend.errors import RuntimeLoadError

# state label -> (the caching allocator's figure, the arena's figure): what the allocator holds
# from the device (reserved segments; blocks handed out) and what live tensors use, now and at peak.
_STATES = {"held": ("memory_reserved", "allocated"), "live": ("memory_allocated", "live"),
           "peak_held": ("max_memory_reserved", "peak_allocated"), "peak_live": ("max_memory_allocated", "peak_live")}


def use(serving) -> None:
    """Install the instance's allocator; a no-op on the CPU and for the caching allocator."""
    if not serving.device.startswith("cuda") or serving.device_allocator == "caching":
        return
    import torch

    try:
        if serving.device_allocator == "expandable":
            # Read when CUDA's allocator starts, which is still to come in this process; torch
            # may have read the variable at import, so its setting is made as well.
            os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
            if hasattr(torch.cuda.memory, "_set_allocator_settings"):
                torch.cuda.memory._set_allocator_settings("expandable_segments:True")
            return
        from latte.memory import torch_pluggable_allocator

        os.environ["LATTE_CUDA_ARENA_BYTES"] = str(serving.device_arena_bytes)
        # arena_pages: the device arena maps the driver's pages under its blocks too (docs/memory.md).
        os.environ["LATTE_CUDA_ARENA_PAGES"] = "1" if serving.arena_pages else "0"
        torch.cuda.memory.change_current_allocator(torch_pluggable_allocator())
    except (RuntimeError, FileNotFoundError) as exc:
        raise RuntimeLoadError(f"device_allocator {serving.device_allocator}: {exc}") from exc


def figures(serving) -> Optional[Tuple[Dict[str, float], Optional[float]]]:
    """Bytes by state (held, live, peak_held, peak_live; the arena adds its capacity), and the
    allocations the device arena refused so far (None without one); None on the CPU or before
    the allocator has served a tensor. The arena's held is its blocks handed out, inside its
    capacity, which it takes from the device whole; a paged arena's is its pages. One reading of
    the arena's statistics."""
    if not serving.device.startswith("cuda"):
        return None
    import torch

    index = torch.device(serving.device).index or 0
    if serving.device_allocator == "arena":
        from latte.memory import torch_arena_statistics

        stats = torch_arena_statistics(index)
        if stats is None:
            return None
        found = {state: float(stats[arena]) for state, (_, arena) in _STATES.items()}
        if stats["page_bytes"]:
            # Paged, the arena takes pages from the device as blocks first touch them and keeps
            # them: what it holds is those pages, which never fall, not its blocks' rounded bytes.
            found["held"] = found["peak_held"] = float(stats["physical_held"])
        found["capacity"] = float(stats["capacity"])
        return found, float(stats["failures"])
    return {state: float(getattr(torch.cuda, caching)(index)) for state, (caching, _) in _STATES.items()}, None
