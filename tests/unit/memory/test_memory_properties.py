"""Property-based: random allocate/free sequences keep the arena consistent."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from latte.memory import BuddyArena

CAPACITY = 1 << 20

# An operation is ("alloc", nbytes) or ("free", index into the live list).
operations = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.one_of(st.integers(1, 4096), st.integers(4097, 400_000))),
        st.tuples(st.just("free"), st.integers(0, 1_000)),
    ),
    min_size=1,
    max_size=80,
)


def _address(array):
    return array.__array_interface__["data"][0]


def _assert_disjoint(live):
    spans = sorted((_address(a), _address(a) + a.nbytes) for a in live)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start, "two live blocks overlap"


@settings(max_examples=150, deadline=None)
@given(ops=operations, size_classes=st.booleans())
def test_random_sequences_keep_invariants(ops, size_classes):
    arena = BuddyArena(CAPACITY, size_classes=size_classes)
    live = []
    for kind, value in ops:
        if kind == "alloc":
            try:
                block = arena.empty(value, np.uint8)
            except MemoryError:
                stats = arena.stats()
                # Refusing is only legitimate when no free block is big enough.
                assert stats["largest_free_block"] < value or value > CAPACITY
                continue
            block[[0, -1]] = len(live) % 251
            live.append(block)
            del block  # the list holds the only reference
        elif live:
            live.pop(value % len(live))  # refcounting frees the block right here
        arena.check_invariants()
        _assert_disjoint(live)
        stats = arena.stats()
        assert stats["live"] == sum(a.nbytes for a in live)
        assert stats["live"] <= stats["allocated"] <= stats["reserved"] <= stats["capacity"]
        assert stats["reserved"] + stats["free"] == stats["capacity"]
    live.clear()
    arena.release_cached()
    stats = arena.stats()
    assert stats["reserved"] == 0
    assert stats["largest_free_block"] == CAPACITY  # everything coalesced back


def test_a_small_request_fits_a_free_block_smaller_than_a_slab():
    """Found by the property above: with size classes, a small request whose slab cannot be
    carved (no free block of a slab's size) is served from a smaller buddy block."""
    arena = BuddyArena(CAPACITY, size_classes=True)
    held = [arena.empty(n, np.uint8) for n in (512 << 10, 256 << 10, 128 << 10, 64 << 10, 32 << 10)]
    stats = arena.stats()
    assert stats["free"] == 32 << 10 and stats["largest_free_block"] == 32 << 10  # no room for a 64 KiB slab
    small = arena.empty(193, np.uint8)
    small[:] = 7
    arena.check_invariants()
    del small
    arena.check_invariants()
    assert arena.stats()["live"] == sum(a.nbytes for a in held)
