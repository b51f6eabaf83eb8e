"""What the page makes of a streaming run (benchmarks/streaming.py): time to first token counted
over every round's first tokens together, since one window holds too few of them for a P99 of its
own."""

import numpy as np
import pytest

import bench_scripts
from latte.bench.streams import StreamFigures, pooled_ms, stream_figures
from latte.triton.streams import StreamRecord


@pytest.fixture(scope="module")
def streaming():
    return bench_scripts.load("streaming")


def window(tokens_per_s, first_tokens_ms, itl_ms=3.0):
    """One round's figures as the benchmark stores them (as_dict(samples=True))."""
    ordered = sorted(first_tokens_ms)
    return StreamFigures(tokens_per_s, float(np.percentile(ordered, 50)), float(np.percentile(ordered, 99)), itl_ms,
                         3 * itl_ms, len(ordered), 16.0, 0, tuple(ordered)).as_dict(samples=True)


def run(latte_windows, stock_windows):
    level = {"gpt": {16: [10000.0] * len(latte_windows)}}
    return {"levels": [16], "kinds": ["gpt"], "max_tokens": 64, "seconds": 6.0, "in_process": level,
            "beside_echo": {"gpt": {16: [8000.0] * len(latte_windows)}},
            "served": {"latte_gpt": {16: latte_windows}, "stock_gpt": {16: stock_windows},
                       # as the benchmark stores the echo's windows: no first-token times
                       "echo": {16: [echo_window()] * len(latte_windows)}}}


def echo_window():
    return StreamFigures(7000.0, 5.0, 5.0, 1.0, 3.0, 100, 16.0, 0, (5.0,) * 100).as_dict()


def ttft_target(summary):
    return next(t for t in summary["targets"] if t.target.startswith("TTFT P99 at 16 streams"))


def test_a_window_keeps_its_first_token_times_sorted_to_three_digits_only_when_asked():
    records = [StreamRecord(b"hello", sent=1.0, arrivals=[1.012345, 1.02]),
               StreamRecord(b"again", sent=1.5, arrivals=[1.504, 1.506])]
    figures = stream_figures(records, 0.5, 2.5)
    assert figures.ttft_ms == (4.0, 12.3)
    assert "ttft_ms" not in figures.as_dict()
    assert figures.as_dict(samples=True)["ttft_ms"] == (4.0, 12.3)


# The stock model's three rounds at 16 streams: a window holds about 100 first tokens, and one
# round had five slow ones. Each round's own P99: 60, 17 and 17 ms (their median 17 ms); the 300
# first tokens together: 60 ms.
STOCK_ROUNDS = [[17.0] * 95 + [60.0] * 5, [17.0] * 100, [17.0] * 100]


def test_the_p99_of_first_tokens_pools_the_rounds():
    rounds = [window(1500.0, times) for times in STOCK_ROUNDS]
    assert sorted(round(r["ttft_p99_ms"]) for r in rounds) == [17, 17, 60]
    assert pooled_ms(rounds, 99) == 60.0
    assert pooled_ms(rounds, 50) == 17.0
    assert pooled_ms([], 99) is None


def test_the_ttft_target_is_judged_on_the_pooled_p99_and_names_how_many_first_tokens(streaming):
    latte = [window(4000.0, [10.0] * 300) for _ in range(3)]
    target = ttft_target(streaming.summarize(run(latte, [window(1500.0, times) for times in STOCK_ROUNDS])))
    # 10 / 60 together; the median of the rounds' own ratios (10 / 17) would miss.
    assert target.met == "yes"
    assert target.measured.startswith("0.17x")
    assert "900 and 300" in target.measured and "0.59x" in target.measured

    target = ttft_target(streaming.summarize(run(latte, [window(1500.0, [17.0] * 100) for _ in range(3)])))
    assert target.met == "no"
    assert target.measured.startswith("0.59x")


def test_the_table_shows_the_pooled_first_token_percentiles(streaming):
    latte = [window(4000.0, [8.0] * 99 + [20.0]), window(4000.0, [9.0] * 99 + [30.0])]
    stock = [window(1500.0, [17.0] * 100), window(1500.0, [18.0] * 100)]
    rows = streaming.summarize(run(latte, stock))["tables"][0].rows
    row = next(r for r in rows if r[:2] == ["gpt", "16"])
    # latte's 200 first tokens: 99 of 8 ms, 99 of 9, then 20 and 30 (the medians of the rounds'
    # own percentiles would read 8.50 / 8.67).
    assert row[11] == "9.00 / 9.11"
    assert row[12] == "17.5 / 18.0"


def h_target(summary):
    return next(t for t in summary["targets"] if t.target.startswith("At least 80 % of the bound H (gpt"))


# Three rounds at 16 streams in which the box slowed down in the last: latte, the echo and the
# loop alone all ran slower in it. Each round's own H: 1 / (1/7000 + 1/14000) = 4667 in the
# first two, 1 / (1/3500 + 1/7000) = 2333 in the last.
LATTE_TOKENS = [3800.0, 3800.0, 1900.0]
ECHO_TOKENS = [7000.0, 7000.0, 3500.0]
LOOP_TOKENS = [14000.0, 14000.0, 7000.0]


def drifting_run(by_round):
    result = run([window(rate, [10.0] * 100) for rate in LATTE_TOKENS], [window(1000.0, [20.0] * 100)] * 3)
    result["served"]["echo"][16] = [StreamFigures(rate, 5.0, 5.0, 1.0, 3.0, 100, 16.0, 0, (5.0,) * 100).as_dict()
                                    for rate in ECHO_TOKENS]
    result["in_process"]["gpt"][16] = list(LOOP_TOKENS)
    if by_round:
        result["in_process_by_round"] = True
    return result


# The loop measured fast in the first round only. Each round's own H: 4667, then
# 1 / (1/7000 + 1/7000) = 3500, then 2333: latte reaches 81 %, 109 % and 81 % of them. The
# medians (latte 3800, echo 7000, loop 7000) give H 3500: 109 %.
UNEVEN_LOOP = [14000.0, 7000.0, 7000.0]


@pytest.mark.parametrize("by_round,loop,measured,medians", [
    # Every round's latte / its own H: 3800 / 4667 = 81 %, 81 %, 1900 / 2333 = 81 %: the medians
    # give the same here.
    (True, LOOP_TOKENS, "81 % at worst (16 streams, the median of the rounds' own ratios", "81 %"),
    # A round's latte is set against its own round's bound, not a fast round's: 81 % at worst,
    # where the medians would read 109 %.
    (True, UNEVEN_LOOP, "81 % at worst", "109 %"),
    # A run that measured the loop before the server has no rounds to pair: the medians' 109 %.
    (False, UNEVEN_LOOP, "109 % at worst", None),
])
def test_latte_is_set_against_the_bound_h_of_its_own_round(streaming, by_round, loop, measured, medians):
    result = drifting_run(by_round)
    result["in_process"]["gpt"][16] = list(loop)
    summary = streaming.summarize(result)
    target = h_target(summary)
    assert target.met == "yes" and target.measured.startswith(measured)
    if medians is None:
        assert target.measured == measured
    else:
        assert f"the medians' ratio {medians}" in target.measured
        assert next(r for r in summary["tables"][0].rows if r[:2] == ["gpt", "16"])[8] == measured.split(" at")[0]


def test_64_streams_no_faster_than_16_names_the_bound_at_both(streaming):
    result = run([window(3300.0, [5.0] * 100) for _ in range(3)], [window(1200.0, [10.0] * 100) for _ in range(3)])
    result["levels"] = [16, 64]
    result["in_process"]["gpt"][64] = [11000.0] * 3
    result["beside_echo"]["gpt"][64] = [9000.0] * 3
    result["served"]["latte_gpt"][64] = [window(3200.0, [13.0] * 100) for _ in range(3)]
    result["served"]["stock_gpt"][64] = [window(1000.0, [67.0] * 100) for _ in range(3)]
    result["served"]["echo"][64] = [echo_window()] * 3
    target = next(t for t in streaming.summarize(result)["targets"] if t.target.startswith("Tokens/s at 64"))
    assert (target.met, target.measured) == ("no", "0.97x (the median of the rounds' own ratios, rounds 0.97-0.97; "
                                                   "the medians 3200 vs 3300)")
    # H = 1 / (1/7000 + 1/10000) = 4118 at 16 and 1 / (1/7000 + 1/11000) = 4278 at 64: the serving
    # cost bounds both levels, which latte reaches 80 % and 75 % of.
    assert target.why.startswith("the bound H grows 1.04x from 16 to 64 streams (4118 to 4278 tokens/s")
    assert "serving cost bounds" in target.why and "80 % and 75 %" in target.why
    # Where H grows, the bound is not claimed.
    result["in_process"]["gpt"][64] = [50000.0] * 3
    target = next(t for t in streaming.summarize(result)["targets"] if t.target.startswith("Tokens/s at 64"))
    assert "serving cost bounds" not in target.why and target.why.startswith("the bound H grows 1.49x")


def test_64_streams_above_16_is_judged_on_each_rounds_own_pair(streaming):
    """The box slows over the run: the medians of each level put 64 streams under 16, while
    every round but one streamed more at 64 than it had at 16."""
    at_16, at_64 = [9000.0, 9200.0, 8700.0, 7500.0, 7800.0], [10700.0, 10100.0, 8500.0, 8600.0, 7700.0]
    result = run([window(t, [5.0] * 100) for t in at_16], [window(3000.0, [10.0] * 100) for _ in at_16])
    result["levels"] = [16, 64]
    result["in_process"]["gpt"][64] = [11000.0] * 5
    result["beside_echo"]["gpt"][64] = [9000.0] * 5
    result["served"]["latte_gpt"][64] = [window(t, [13.0] * 100) for t in at_64]
    result["served"]["stock_gpt"][64] = [window(2600.0, [67.0] * 100) for _ in at_64]
    result["served"]["echo"][64] = [echo_window()] * 5
    target = next(t for t in streaming.summarize(result)["targets"] if t.target.startswith("Tokens/s at 64"))
    # 64 / 16 by round: 1.19, 1.10, 0.98, 1.15, 0.99.
    assert (target.met, target.why) == ("yes", "")
    assert target.measured == ("1.10x (the median of the rounds' own ratios, rounds 0.98-1.19; "
                               "the medians 8600 vs 8700)")


def test_a_missed_share_of_h_names_what_the_responses_cost_at_latte_s_cadence(streaming):
    """H's echo sends each stream's responses back to back; latte sends one a stream each
    iteration. The run measures the echo at that cadence too, with the CPU each response costs
    the machine, the server and the clients, and the model's stub; a missed 80 % names what the
    server and the clients spend at each traffic."""
    def cores(busy, server, client, stub):
        return {"busy_cores": busy, "process_cores": {"server": server, "client": client, "stub": stub}}

    latte = [{**window(3500.0, [5.0] * 100, itl_ms=1.6), **cores(1.68, 0.5, 0.4, 0.78)} for _ in range(3)]
    result = run(latte, [window(1200.0, [10.0] * 100) for _ in range(3)])
    result["in_process_by_round"] = True
    result["served"]["echo"][16] = [{**echo_window(), **cores(1.82, 0.7, 0.7, 0.4)}] * 3  # 7000 responses a second
    result["served"]["echo_at_gpt"] = {16: [{**echo_window(), "tokens_per_s": 5000.0, **cores(1.5, 0.6, 0.6, 0.3),
                                             "gap_ms": 1.6}] * 3}
    summary = streaming.summarize(result)
    # H = 1 / (1/7000 + 1/10000) = 4118: latte's 3500 is 85 %; below 80 % the reason is given.
    assert h_target(summary).met == "yes" and h_target(summary).why == ""
    # µs a token or response: 1e6 x cores / tokens per second.
    assert summary["tables"][1].rows == [["gpt", "16", "480 (1.68)", "257 / 223", "260 (1.82)", "200 / 57", "1.60",
                                          "300 (1.50)", "240 / 60", "5000"]]
    for run_ in result["served"]["latte_gpt"][16]:
        run_["tokens_per_s"] = 3000.0   # 73 % of H
    missed = h_target(streaming.summarize(result))
    assert missed.met == "no"
    # the CPU a response costs at each traffic: the echo back to back, at latte's cadence, latte's tokens
    assert [f"{us} µs" in missed.why for us in (200, 240, 300)] == [True, True, True], missed.why


def test_a_run_without_the_cores_read_has_no_cpu_table(streaming):
    result = run([window(3500.0, [5.0] * 100)] * 3, [window(1200.0, [10.0] * 100)] * 3)
    result["served"]["echo_at_gpt"] = {16: [{**echo_window(), "gap_ms": 1.6}] * 3}
    assert len(streaming.summarize(result)["tables"]) == 1
    # The machine read but not the processes (a window whose stub ended meanwhile): no row either.
    for runs in (result["served"]["latte_gpt"][16], result["served"]["echo"][16], result["served"]["echo_at_gpt"][16]):
        for i, run_ in enumerate(runs):
            runs[i] = {**run_, "busy_cores": 1.5}
    assert len(streaming.summarize(result)["tables"]) == 1
