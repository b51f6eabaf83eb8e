"""Where the request path's buffers come from: the current resource, chosen out loud."""

import logging

import numpy as np
import pytest

from latte.backend import memory_resource
from latte.backend.batching import packed
from latte.memory import BuddyArena


@pytest.fixture
def nothing_current(monkeypatch):
    monkeypatch.setattr(memory_resource, "_current", None)
    monkeypatch.setattr(memory_resource, "_said", False)


def test_a_batch_packed_while_an_arena_is_current_lives_in_it(nothing_current):
    arena = BuddyArena(1 << 20)
    memory_resource.use(arena.empty)
    try:
        batch = packed([np.ones((1, 3), np.float32), np.ones((2, 2), np.float32)], (3, 3), np.dtype(np.float32), 0.0)
        assert arena.stats()["live"] >= batch.nbytes
        np.testing.assert_array_equal(batch, [[1, 1, 1], [1, 1, 0], [1, 1, 0]])
    finally:
        memory_resource.release(arena.empty)
    del batch
    assert arena.stats()["live"] == 0


def test_with_no_arena_current_numpy_serves_and_the_log_says_so_once(nothing_current, caplog):
    with caplog.at_level(logging.INFO, logger="latte.memory"):
        memory_resource.empty((2, 3), np.float32)
        memory_resource.empty((4,), np.int64)
    assert [record.levelname for record in caplog.records] == ["WARNING"]
    assert caplog.records[0].getMessage() == ("no arena is current (memory_resource.use sets one); buffers on the "
                                              "request path come from numpy's allocator")


def test_numpy_chosen_on_purpose_is_logged_with_the_reason_and_not_as_a_warning(nothing_current, caplog):
    with caplog.at_level(logging.INFO, logger="latte.memory"):
        memory_resource.use_numpy("a profile times the model")
        memory_resource.empty((2, 3), np.float32)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "buffers on the request path come from numpy's allocator: a profile times the model")]


def test_an_arena_released_by_another_model_leaves_the_current_one_alone(nothing_current):
    first, second = BuddyArena(1 << 20), BuddyArena(1 << 20)
    memory_resource.use(second.empty)
    memory_resource.release(first.empty)  # the first model unloads after the second loaded
    buffer = memory_resource.empty((8,), np.float32)
    assert second.stats()["live"] >= buffer.nbytes and first.stats()["live"] == 0
    memory_resource.release(second.empty)
