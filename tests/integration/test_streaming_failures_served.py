"""Streams that fail beside healthy ones, under a real tritonserver over gRPC: a stream whose
step fails, and streams that find the stream cache short, end with an error that says so, while
the streams beside them complete with every output they asked for; the server then serves new
streams. The model is the unit tests' counting stream (served_counting.py), slowed so that streams
sent one after another share the loop's batches."""

import pytest

from conftest import assert_stopped_promptly
from served_counting import CountingStream, expected_totals, expected_ys, run_counting, wait_all

# 14 blocks of 4 cache rows: 56 rows for every stream together.
SHORT_CACHE_BLOCKS = 14


@pytest.fixture(scope="module")
def counting_server(tmp_path_factory):
    from latte.triton import TritonServer
    from served_counting import write_counting_model

    work = tmp_path_factory.mktemp("counting")
    repo = work / "repository"
    repo.mkdir()
    write_counting_model(repo, "counting", max_tokens=10)
    write_counting_model(repo, "counting_short", max_tokens=12, cache_blocks=SHORT_CACHE_BLOCKS)
    with TritonServer(repo, log_path=work / "tritonserver.log") as running:
        yield running
    assert_stopped_promptly(running)


def assert_complete(record, outputs):
    assert record.error is None and record.ended, record
    assert record.ys == expected_ys(record.x, outputs), record
    assert record.totals == expected_totals(record.x, outputs), record


def test_a_failing_stream_ends_naming_its_step_while_the_streams_beside_it_complete(counting_server):
    url = counting_server.grpc_url
    # Four healthy streams of 10 outputs (0.5 s at least; a prompt and its outputs within the
    # context of 64 rows), running before the failing one joins
    # them: its third output, token 13, fails the step of the batch they share.
    healthy = [CountingStream(url, "counting", x).start() for x in (2, 20, 30, 40)]
    for stream in healthy:
        assert stream.record.first_output.wait(30), stream.record
    failing = CountingStream(url, "counting", 11).start()
    unlucky = failing.wait()
    records = wait_all(healthy)

    assert unlucky.ended and unlucky.ys == [11, 12, 13]
    assert "step 'count' failed: RuntimeError: unlucky thirteen" in unlucky.error, unlucky
    for record in records:
        assert_complete(record, 10)
        assert unlucky.ended_at < record.ended_at  # it ran beside them from its start to its failure
    assert_complete(run_counting(url, "counting", 22), 10)  # the server serves the next stream


def test_streams_the_cache_cannot_hold_end_out_of_memory_while_the_others_complete(counting_server):
    url = counting_server.grpc_url
    # A stream of 20 prompt rows and 12 outputs holds 5 to 8 of the 14 blocks for 0.6 s at least.
    holder = CountingStream(url, "counting_short", 20).start()
    assert holder.record.first_output.wait(30), holder.record
    # Beside it: a prompt of 40 rows needs 10 blocks, more than are free while the holder runs
    # (it would fit alone); two short streams need 2 blocks each.
    refused = CountingStream(url, "counting_short", 40).start()
    small = [CountingStream(url, "counting_short", 2, max_tokens=5).start() for _ in range(2)]
    short = refused.wait()
    records = wait_all([holder, *small])

    assert short.ended and short.ys == [], short
    assert "the stream's cache is held by the running streams: cache blocks: 10 needed" in short.error, short
    assert "it is refused, retry once some end" in short.error, short
    assert short.ended_at < records[0].ended_at  # refused while the holder ran
    assert_complete(records[0], 12)
    for record in records[1:]:
        assert_complete(record, 5)

    # A stream whose prompt fits but whose outputs outgrow the whole cache: 51 rows of the 56,
    # then 5 outputs more, and the 57th row finds no block.
    outgrown = run_counting(url, "counting_short", 51)
    assert outgrown.ys == [51, 52, 53, 54, 55, 56], outgrown
    assert "the stream cache ran short after 56 tokens" in outgrown.error, outgrown

    # Every block came back: the stream refused beside the holder is served alone.
    assert_complete(run_counting(url, "counting_short", 40, max_tokens=8), 8)
