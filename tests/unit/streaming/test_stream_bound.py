"""The in-process loop a served streaming model is measured against, alone and beside the echo."""

import itertools

import pytest

from latte.bench.streams import BENCH_PROMPTS, in_process_beside_echo, in_process_model, in_process_tokens_per_s
from latte.triton.server import free_port


@pytest.fixture(scope="module")
def gru_model(tmp_path_factory):
    from latte.examples.streams import write_stream_model

    model = in_process_model(write_stream_model(tmp_path_factory.mktemp("examples"), "textgen_gru", "gru"))
    yield model
    model.finalize()


def test_the_rate_is_per_second_of_the_clock_given_and_the_loop_is_left_empty(gru_model):
    ticks = itertools.count(0.0, 2.0)  # the window opens at 0 and closes at 2 on this clock
    rate = in_process_tokens_per_s(gru_model, BENCH_PROMPTS, 2, 4, seconds=0.3, clock=lambda: next(ticks))
    tokens = rate * 2.0
    assert tokens == int(tokens) and tokens >= 2  # every token of the window, over two of its seconds
    assert gru_model.runner.idle


def test_a_loop_beside_echo_clients_that_could_not_connect_is_not_a_figure(gru_model):
    nothing_there = free_port()
    with pytest.raises(RuntimeError, match=r"the echo's clients failed \(exit 1\): .*connect"):
        in_process_beside_echo(gru_model, f"localhost:{nothing_there}", "echo", BENCH_PROMPTS, 2, 4, seconds=0.3)
    assert gru_model.runner.idle
