"""The backend's in-process figures: what one execute call records, whatever its size."""

import numpy as np
import pytest

from latte.backend.metrics import LATENCY_BUCKETS_US, BackendMetrics


def test_requests_answered_together_are_counted_once_per_outcome_and_priority():
    metrics = BackendMetrics()
    metrics.requests({("success", 0): 5, ("bad_request", 0): 1, ("success", 2): 2}, seconds=0.0004)
    counters, _ = metrics.aggregate.snapshot()
    assert counters[("latte_requests_total", (("outcome", "success"),))] == 7
    assert counters[("latte_requests_total", (("outcome", "bad_request"),))] == 1
    # 400 us falls in the 500 us bucket: six requests at priority 0 observed there at once.
    bucket = ("latte_request_duration_us_bucket", (("priority", "0"), ("le", "500")))
    assert counters[bucket] == 6
    assert counters[("latte_request_duration_us_sum", (("priority", "0"),))] == pytest.approx(6 * 400.0)
    assert counters[("latte_request_duration_us_count", (("priority", "2"),))] == 2
    assert 500 in LATENCY_BUCKETS_US


def test_execute_stages_add_up_per_call():
    metrics = BackendMetrics()
    metrics.execute(requests=8, read_s=20e-6, engine_s=50e-6, respond_s=30e-6)
    metrics.execute(requests=4, read_s=10e-6, engine_s=25e-6, respond_s=15e-6)
    counters, _ = metrics.aggregate.snapshot()
    assert counters[("latte_execute_calls_total", ())] == 2
    assert counters[("latte_execute_requests_total", ())] == 12
    stages = {stage: counters[("latte_execute_us_total", (("stage", stage),))] for stage in ("read", "engine", "respond")}
    assert stages == pytest.approx({"read": 30.0, "engine": 75.0, "respond": 45.0})


def test_calls_recorded_while_another_thread_reads_the_figures_are_all_counted():
    import sys
    import threading

    metrics = BackendMetrics()
    calls_per_thread, threads = 5000, 4
    done = threading.Event()

    def record():
        for _ in range(calls_per_thread):
            metrics.call(1, 1e-6, 1e-6, 1e-6, [({("success", 0): 1}, 1e-5)], [(1, 1e-6, False)])

    def read():  # the publisher's reads, as often as they can come
        while not done.is_set():
            metrics.aggregate.snapshot()

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the GIL over as often as possible, to interleave the two sides
    try:
        reader = threading.Thread(target=read)
        writers = [threading.Thread(target=record) for _ in range(threads)]
        reader.start()
        for w in writers:
            w.start()
        for w in writers:
            w.join()
        done.set()
        reader.join()
    finally:
        sys.setswitchinterval(switch)
    counters, _ = metrics.aggregate.snapshot()
    assert counters[("latte_execute_calls_total", ())] == calls_per_thread * threads
    assert counters[("latte_requests_total", (("outcome", "success"),))] == calls_per_thread * threads


def test_plain_calls_folded_together_record_what_each_call_would():
    """plain_call is call for the common case, folded many records at a time: every counter
    and histogram bucket comes out as recording each call with `call` would give."""
    rng = np.random.default_rng(7)
    one_by_one, together = BackendMetrics(), BackendMetrics()
    for _ in range(300):
        requests, rows = int(rng.integers(1, 9)), int(rng.integers(1, 40))
        read_s, engine_s, respond_s, model_s = rng.uniform(1e-6, 3e-3, 4)
        one_by_one.call(requests, read_s, engine_s, respond_s, [({("success", 0): requests}, read_s + engine_s)],
                        [(rows, model_s, False)])
        together.plain_call(requests, read_s, engine_s, respond_s, rows, model_s)
    want, _ = one_by_one.aggregate.snapshot()
    got, _ = together.aggregate.snapshot()
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-9), key
    assert got[("latte_batch_size_count", ())] == 300


def test_plain_calls_past_the_deferred_limit_are_folded_on_the_way_and_none_lost():
    from latte.backend import metrics as module

    metrics = BackendMetrics()
    for _ in range(module._MAX_DEFERRED * 2 + 5):
        metrics.plain_call(2, 1e-6, 1e-6, 1e-6, 2, 1e-6)
    counters, _ = metrics.aggregate.snapshot()
    assert counters[("latte_execute_requests_total", ())] == 2 * (module._MAX_DEFERRED * 2 + 5)


def test_a_failed_batch_is_counted_as_failed_not_as_a_served_batch():
    metrics = BackendMetrics()
    # One call: a batch of 4 rows failed, then its requests ran alone (4 one-row batches).
    metrics.call(4, 1e-6, 1e-6, 1e-6, [({("success", 0): 3, ("model_error", 0): 1}, 1e-5)],
                 [(4, 1e-6, True)] + [(1, 1e-6, False)] * 3 + [(1, 1e-6, True)])
    counters, _ = metrics.aggregate.snapshot()
    assert counters[("latte_failed_batches_total", ())] == 2
    assert counters[("latte_batch_size_count", ())] == 3
    assert counters[("latte_batch_size_sum", ())] == 3
