"""The pools stream state lives in: blocks counted from free lists, rows written and read back."""

import numpy as np
import pytest

from latte.backend.streaming.blocks import BlockPool, ShortOfBlocks, StatePool


def test_blocks_are_taken_lowest_first_and_refused_past_the_pool_saying_how_many():
    pool = BlockPool(5, 4, (2,), np.float32)
    assert pool.take(2) == [1, 2] and pool.take(1) == [3]
    pool.give_back([1, 2])
    assert pool.free == 4 and pool.taken == 1
    with pytest.raises(ShortOfBlocks, match="cache blocks: 5 needed, 4 of 5 free"):
        pool.take(5)
    assert pool.take(4) == [1, 2, 4, 5]  # what came back is taken again, lowest first


def test_a_streams_rows_come_back_gathered_in_order_past_its_blocks_zeros():
    pool = BlockPool(8, 4, (3,), np.float32)
    rows = np.arange(30, dtype=np.float32).reshape(10, 3)
    blocks = pool.take(pool.blocks_for(10))
    pool.write_rows(blocks, rows)
    table = np.array([blocks + [0]])
    gathered = pool.gather(table)
    assert gathered.shape == (1, 16, 3)
    assert np.array_equal(gathered[0, :10], rows) and not gathered[0, 12:].any()
    pool.append(np.array([blocks[2]]), np.array([2]), np.full((1, 3), 7, np.float32))
    assert pool.gather(np.array([blocks]))[0, 10].tolist() == [7, 7, 7]


def test_state_slots_gather_and_write_rows_of_every_tensor():
    pool = StatePool(4, {"h": ((2,), np.float32), "t": ((1,), np.int64)})
    a, b = pool.take(), pool.take()
    pool.write(np.array([a, b]), {"h": np.array([[1, 2], [3, 4]], np.float32), "t": np.array([[5], [6]])})
    got = pool.gather(np.array([b, a]))
    assert got["h"].tolist() == [[3, 4], [1, 2]] and got["t"].tolist() == [[6], [5]]
    assert pool.taken == 2 and pool.row_bytes == 2 * 4 + 8
