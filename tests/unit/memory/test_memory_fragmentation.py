"""The arena's fragmentation figures that can alarm: the largest request it can still serve
against the P99 request seen, and failures that had room to spare (docs/memory.md)."""

import gc

import numpy as np
import pytest

from latte.backend.metrics import BackendMetrics
from latte.bench.soak import LONG_TARGETS, SHORT_TARGETS, check_ratios
from latte.memory import BuddyArena

KiB = 1 << 10
MiB = 1 << 20


def fragmented_arena():
    """A 1 MiB arena whose free half lies in eight separate 64 KiB pieces, after a 128 KiB
    request that found 512 KiB free but no block to hold it."""
    arena = BuddyArena(1 * MiB, size_classes=False)
    blocks = [arena.empty(64 * KiB, np.uint8) for _ in range(16)]
    del blocks[::2]
    gc.collect()
    with pytest.raises(MemoryError, match="largest free block 65536 bytes"):
        arena.empty(128 * KiB, np.uint8)
    return arena, blocks


def test_a_healthy_arena_reads_healthy_though_one_minus_largest_over_free_is_near_one_half():
    arena = BuddyArena(1 * MiB, size_classes=False)
    held = [arena.empty(64 * KiB, np.uint8), arena.empty(100 * KiB, np.uint8)]
    stats = arena.stats()
    assert stats["external_fragmentation"] > 0.4  # why that figure cannot alarm
    assert 100 * KiB <= stats["p99_request"] <= 100 * KiB * 9 // 8
    assert stats["largest_free_block"] >= stats["p99_request"]
    assert stats["fragmented"] is False
    assert stats["fragmentation_failures"] == 0
    del held


def test_a_fragmented_arena_alarms():
    arena, _held = fragmented_arena()
    stats = arena.stats()
    assert stats["free"] == 512 * KiB and stats["largest_free_block"] == 64 * KiB
    assert stats["p99_request"] >= 128 * KiB
    assert stats["fragmented"] is True
    # live 512 KiB + the 128 KiB asked = 62.5 % of the capacity: room there was, in pieces.
    assert stats["failures"] == 1 and stats["fragmentation_failures"] == 1


def test_the_alarm_clears_once_the_pieces_coalesce():
    arena, held = fragmented_arena()
    del held[:]
    gc.collect()
    stats = arena.stats()
    assert stats["fragmented"] is False
    assert stats["largest_free_block"] == 1 * MiB
    assert stats["fragmentation_failures"] == 1  # a count of what happened, not a state


def test_a_full_arena_is_not_called_fragmented():
    arena = BuddyArena(1 * MiB, size_classes=False)
    held = [arena.empty(64 * KiB, np.uint8) for _ in range(16)]
    with pytest.raises(MemoryError):
        arena.empty(64 * KiB, np.uint8)
    stats = arena.stats()
    assert stats["free"] == 0
    assert stats["fragmented"] is False
    assert stats["failures"] == 1 and stats["fragmentation_failures"] == 0
    del held


def test_the_backend_publishes_the_alarm_and_the_fit_figures():
    arena, _held = fragmented_arena()
    metrics = BackendMetrics()
    metrics.arena(arena.stats())
    _, gauges = metrics.aggregate.snapshot()
    assert gauges[("latte_arena_fragmented", ())] == 1.0
    assert gauges[("latte_arena_failures", (("kind", "fragmentation"),))] == 1.0
    assert gauges[("latte_arena_failures", (("kind", "all"),))] == 1.0
    assert gauges[("latte_arena_fit_bytes", (("figure", "largest_free_block"),))] == 64 * KiB
    assert gauges[("latte_arena_fit_bytes", (("figure", "p99_request"),))] >= 128 * KiB


def test_the_soak_holds_the_alarm_and_the_fragmentation_failures_to_zero():
    healthy = {"fragmented_windows": 0, "fragmentation_failures": 0, "fragmentation_last": 0.495}
    assert check_ratios(healthy, SHORT_TARGETS) == []
    fragmented = {"fragmented_windows": 3, "fragmentation_failures": 1}
    assert check_ratios(fragmented, LONG_TARGETS) == [
        "fragmented_windows = 3 exceeds the bound 0",
        "fragmentation_failures = 1 exceeds the bound 0",
    ]
