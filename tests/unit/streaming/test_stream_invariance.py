"""A stream's outputs do not depend on how many streams share its batch: the fewest rows that
holds for is measured at load (min_batch_rows: auto), and smaller batches are padded up to it
with copies of their first row, whose outputs go nowhere."""

import numpy as np
import pytest

from counting_stream import counting_runner, write_counting_stream
from latte.backend.errors import ConfigError
from latte.backend.options import RequestOptions
from latte.backend.streaming.controls import StreamControls
from latte.backend.streaming.definition import load_stream
from latte.backend.streaming.invariance import fewest_invariant_rows, probe_feed
from latte.backend.streaming.options import parse_stream_options
from latte.backend.streaming.streams import Stream
from test_stream_examples import request, served, texts, wait_final


def summed_in_blocks(values, block):
    """Row sums of a product whose kernel sums in `block`-wide chunks below 4 rows: the float
    results of 1-3 row batches differ from those of larger ones, as BLAS kernels' do."""
    def run(rows):
        data = values[:rows]
        if rows >= 4:
            return {"y": data.sum(axis=1)}
        return {"y": np.add.reduceat(data, np.arange(0, data.shape[1], block), axis=1).sum(axis=1)}
    return run


def test_the_fewest_rows_are_those_from_which_every_batch_agrees_with_the_largest():
    values = np.random.default_rng(3).standard_normal((8, 1000)).astype(np.float32)
    assert fewest_invariant_rows(summed_in_blocks(values, block=7)) == 4
    assert fewest_invariant_rows(lambda rows: {"y": values[:rows] * 2}) == 1
    nan = np.full((8, 2), np.nan)
    assert fewest_invariant_rows(lambda rows: {"y": nan[:rows]}) == 1  # the same bits, though NaN != NaN
    asked = []
    fewest_invariant_rows(lambda rows: asked.append(rows) or {"y": values[:rows] * 2}, probe_rows=5)
    assert asked == [5, 4, 3, 2, 1]


def test_the_probe_feed_varies_floats_by_row_and_keeps_indices_valid():
    feed = probe_feed({"hidden": ((3,), np.float32), "token": ((1,), np.int64)}, rows=4)
    assert feed["hidden"].shape == (4, 3) and feed["hidden"].dtype == np.float32
    assert len({row.tobytes() for row in feed["hidden"]}) == 4
    assert feed["token"].shape == (4, 1) and not feed["token"].any()


@pytest.fixture(scope="module")
def counting_path(tmp_path_factory):
    return write_counting_stream(tmp_path_factory.mktemp("counting"), max_tokens=256)


def test_a_padded_batch_gives_each_stream_its_own_outputs_and_writes_nothing_for_the_pad(counting_path):
    runner = counting_runner(counting_path)
    runner.engine.min_rows = 4
    controls = StreamControls(stream=True, max_tokens=6, options=RequestOptions())
    one, two = Stream({"x": np.array([3], dtype=np.int64)}, controls, 0.0), \
        Stream({"x": np.array([40], dtype=np.int64)}, controls, 0.0)
    runner.submit([one, two])
    ys = {one: [], two: []}
    while not runner.idle:
        for stream, outcome, _ in runner.run_once():
            ys[stream].append(int(outcome["y"][0]))
            held = runner.engine.held()
            assert held["held_bytes"] == held["needed_bytes"]
    assert ys == {one: [3, 4, 5, 6, 7, 8], two: [40, 41, 42, 43, 44, 45]}
    assert runner.engine.cache.taken == 0 and runner.engine.state.taken == 0


def test_min_batch_rows_is_auto_or_a_count(counting_path):
    definition = load_stream(counting_path)
    assert parse_stream_options("m", {}, definition).min_batch_rows == 1
    assert parse_stream_options("m", {"min_batch_rows": "auto"}, definition).min_batch_rows is None
    assert parse_stream_options("m", {"min_batch_rows": "4"}, definition).min_batch_rows == 4
    with pytest.raises(ConfigError, match=r"min_batch_rows'\] must be auto or an integer >= 1, got 'some'"):
        parse_stream_options("m", {"min_batch_rows": "some"}, definition)
    with pytest.raises(ConfigError, match=r"min_batch_rows\"\] is 9, more than max_streams=8"):
        parse_stream_options("m", {"min_batch_rows": "9", "max_streams": "8"}, definition)


PROMPTS = [b"Once upon a time", b"The quick brown fox jumps", b"hello", b"Streams join and leave between steps",
           b"a b c d e f g", b"Triton serves models", b"what comes next?", b"0123456789"]


@pytest.mark.parametrize("kind", ["gpt", "gru"])
def test_with_min_batch_rows_auto_every_stream_equals_itself_served_alone(kind, tmp_path):
    model, _ = served(kind, tmp_path, max_streams=16, min_batch_rows="auto")
    try:
        assert model.engine.min_rows == model.engine.measure_invariant_rows(16)  # measured, not fallen back
        together = [request(p, 64, ignore_eos=True) for p in PROMPTS * 2]
        model.execute(together)
        wait_final(together)
        for prompt, call in zip(PROMPTS * 2, together):
            alone = request(prompt, 64, ignore_eos=True)
            model.execute([alone])
            wait_final([alone])
            assert len(texts(call)[0]) == 64
            assert texts(call)[0] == texts(alone)[0]
    finally:
        model.finalize()
