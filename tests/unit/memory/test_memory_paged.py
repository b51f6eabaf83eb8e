"""The paged arena: blocks contiguous in addresses over any free physical pages, so a request
fails only when its pages are not there (docs/memory.md, "Paged arenas")."""

import gc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latte.memory import BuddyArena

KiB = 1 << 10
MiB = 1 << 20
PAGE = 64 * KiB


def paged(capacity=1 * MiB, **options):
    return BuddyArena(capacity, paged=True, page_bytes=PAGE, **options)


def checkerboard(arena, pages=16):
    """Every other page-sized block freed: half the memory free, in pieces of one page."""
    blocks = [arena.empty(PAGE, np.uint8) for _ in range(pages)]
    del blocks[1::2]
    gc.collect()
    return blocks


def test_half_of_a_checkerboarded_arena_is_one_block_where_the_plain_buddy_refuses():
    plain = BuddyArena(1 * MiB, size_classes=False)
    held = checkerboard(plain)
    with pytest.raises(MemoryError, match="largest free block 65536 bytes"):
        plain.empty(128 * KiB, np.uint8)

    arena = paged(size_classes=False)
    kept = checkerboard(arena)
    block = arena.empty(8 * PAGE, np.uint8)  # all eight free pages, as one array
    block[:] = 7
    for piece in kept:
        piece[:] = 1
    assert int(block.sum()) == 7 * 8 * PAGE
    stats = arena.stats()
    assert stats["paged"] is True and stats["page_bytes"] == PAGE
    assert stats["free"] == 0 and stats["fragmented"] is False
    assert stats["fragmentation_failures"] == 0
    arena.check_invariants()
    del held


def test_a_request_past_the_free_pages_is_a_memory_error_that_names_the_capacity():
    arena = paged(size_classes=False)
    kept = checkerboard(arena)
    with pytest.raises(MemoryError, match=r"live blocks hold 524288 of the 1048576-byte capacity in pages of 65536"):
        arena.empty(9 * PAGE, np.uint8)
    with pytest.raises(MemoryError, match="1048576-byte capacity"):
        arena.empty(2 * MiB, np.uint8)
    arena.check_invariants()
    del kept


def test_a_warm_large_block_reuses_its_mapping():
    arena = paged()
    block = arena.empty(5 * PAGE, np.uint8)
    maps = arena.stats()["map_calls"]
    del block
    again = arena.empty(5 * PAGE, np.uint8)
    stats = arena.stats()
    assert stats["map_calls"] == maps and stats["unmap_calls"] == 0
    assert stats["mapped"] == 5 * PAGE
    del again
    arena.release_cached()  # idle pages unmapped, their memory given back
    stats = arena.stats()
    assert stats["mapped"] == 0 and stats["physical_held"] == 0 and stats["unmap_calls"] >= 1


def test_a_negative_idle_share_is_refused():
    with pytest.raises(ValueError, match="idle_share must be 0"):
        BuddyArena(1 * MiB, paged=True, page_bytes=PAGE, idle_share=-1)


def test_bad_page_sizes_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="page_bytes must be a power of two"):
        BuddyArena(1 * MiB, paged=True, page_bytes=3 * KiB)
    with pytest.raises(ValueError, match="capacity must hold at least one page"):
        BuddyArena(32 * KiB, paged=True, page_bytes=PAGE)


CAPACITY = 1 * MiB

operations = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.one_of(st.integers(1, 4096), st.integers(4097, 400_000))),
        st.tuples(st.just("free"), st.integers(0, 1_000)),
        # a block grows or shrinks: a new one, the bytes copied, the old one freed (as realloc does)
        st.tuples(st.just("resize"), st.tuples(st.integers(0, 1_000),
                                               st.one_of(st.integers(1, 4096), st.integers(4097, 400_000)))),
    ),
    min_size=1,
    max_size=80,
)


@settings(max_examples=100, deadline=None)
@given(ops=operations, size_classes=st.booleans(), idle_share=st.sampled_from([0, 1, 8]))
def test_a_paged_arena_refuses_only_what_its_free_pages_cannot_hold(ops, size_classes, idle_share):
    """Through random allocations, frees and resizes, every invariant holds after each step,
    whether idle pages are kept (0) or remapped past their share of the pages in use."""
    arena = paged(CAPACITY, size_classes=size_classes, idle_share=idle_share)
    live = []
    for kind, value in ops:
        if kind in ("alloc", "resize"):
            index, size = (None, value) if kind == "alloc" else (value[0] % len(live) if live else None, value[1])
            if kind == "resize" and index is None:
                continue
            try:
                block = arena.empty(size, np.uint8)
            except MemoryError:
                # The pages are not there: a block (its size rounded to 256 bytes) spans at most
                # one page more than it fills. A block being resized stays as it was.
                assert size + 256 + PAGE > arena.stats()["free"]
                continue
            if index is None:
                block[[0, -1]] = len(live) % 251
                live.append(block)
            else:
                old = live[index]
                kept = min(old.nbytes, size)
                block[:kept] = old[:kept]
                assert block[0] == old[0] and block[kept - 1] == old[kept - 1]
                block[-1] = block[0]
                live[index] = block
                del old
            del block
        elif live:
            live.pop(value % len(live))
        arena.check_invariants()
        stats = arena.stats()
        assert stats["live"] == sum(a.nbytes for a in live)
        assert stats["live"] <= stats["allocated"] <= stats["reserved"] <= stats["capacity"]
        assert stats["reserved"] + stats["free"] == stats["capacity"]
        assert stats["physical_held"] <= stats["capacity"]
    live.clear()
    arena.release_cached()
    stats = arena.stats()
    assert stats["reserved"] == 0 and stats["physical_held"] == 0


def test_a_model_with_arena_pages_serves_its_batches_from_a_paged_arena(example_repo):
    from example_models import example_model
    from latte.backend.standin_stub import InferenceRequest
    from latte.examples import EXAMPLES

    model = example_model(example_repo, "sequence_onnx", arena_pages="true", arena_bytes=str(8 * MiB))
    try:
        assert model.arena.stats()["paged"] is True and model.arena.capacity == 8 * MiB
        rng = np.random.default_rng(4)
        responses = model.execute([InferenceRequest(EXAMPLES["sequence"].sample(1, rng)) for _ in range(6)])
        assert not any(r.has_error() for r in responses)
        assert model.arena.stats()["map_calls"] > 0  # the batches' buffers came from mapped pages
    finally:
        model.finalize()


def test_arena_pages_needs_an_arena_of_at_least_one_page(example_repo):
    from example_models import example_spec
    from latte.backend.errors import ConfigError

    with pytest.raises(ConfigError, match=r"a paged arena \(arena_pages\) needs at least one page of 1048576 bytes"):
        example_spec(example_repo, "sequence_onnx", arena_pages="true", arena_bytes=str(512 * KiB))


def test_an_arena_of_more_pages_than_the_mapping_limit_allows_is_the_plain_buddy_saying_why():
    from pathlib import Path

    limit = Path("/proc/sys/vm/max_map_count")
    if not limit.exists():
        pytest.skip("no /proc/sys/vm/max_map_count on this system")
    pages = int(limit.read_text()) // 2 + 1   # each mapped page may be a mapping between reserved ones
    with pytest.warns(RuntimeWarning, match=r"plain buddy serves: paged arena: \d+ pages of 4096 bytes may need up "
                                            r"to \d+ mappings, and vm.max_map_count is \d+"):
        arena = BuddyArena(pages * 4096, paged=True, page_bytes=4096, prefault=False)
    assert arena.stats()["paged"] is False and "raise page_bytes" in arena.fallback_reason
    block = arena.empty(1 << 20, np.uint8)
    block[:] = 1
    assert int(block.sum()) == 1 << 20


def test_the_backend_publishes_a_paged_arenas_pages_and_calls():
    from latte.backend.metrics import BackendMetrics

    arena = paged(CAPACITY)
    block = arena.empty(3 * PAGE, np.uint8)
    metrics = BackendMetrics()
    metrics.arena(arena.stats())
    _, gauges = metrics.aggregate.snapshot()
    stats = arena.stats()
    assert gauges[("latte_arena_page_bytes", (("state", "mapped"),))] == stats["mapped"] >= 3 * PAGE
    assert gauges[("latte_arena_page_bytes", (("state", "physical_held"),))] == stats["physical_held"]
    assert gauges[("latte_arena_page_calls", (("call", "map"),))] == stats["map_calls"] >= 1
    assert ("latte_arena_page_calls", (("call", "unmap"),)) in gauges
    del block
