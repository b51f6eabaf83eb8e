"""latte.scheduling from Python: real lane threads calling a numpy model."""

from __future__ import annotations

import threading
import time
from collections import Counter

import numpy as np
import pytest

from latte.scheduling import PRIORITY_LEVELS, REJECT_REASONS, AffinityScheduler


class Outcomes:
    """Collects on_complete calls; lane threads and submitters share it under a lock."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self.calls: list[tuple[int, str | None]] = []

    def __call__(self, request_id: int, error: str | None) -> None:
        with self._lock:
            self.calls.append((request_id, error))
            self._lock.notify_all()

    def wait_for(self, count: int, timeout: float = 10.0) -> None:
        with self._lock:
            if not self._lock.wait_for(lambda: len(self.calls) >= count, timeout):
                raise TimeoutError(f"{len(self.calls)} of {count} outcomes after {timeout}s")

    def by_id(self) -> dict[int, str | None]:
        with self._lock:
            return dict(self.calls)


class GatedModel:
    """A small dense layer per key; the first call can be held so requests pile up behind it."""

    def __init__(self, hold_first: bool = False) -> None:
        self._lock = threading.Lock()
        self.batches: list[tuple[str, list[int], int]] = []
        self.release = threading.Event()
        self.started = threading.Event()
        self._hold = hold_first
        self._weights: dict[str, np.ndarray] = {}

    def __call__(self, key: str, request_ids: list[int], lane: int) -> None:
        with self._lock:
            self.batches.append((key, list(request_ids), lane))
            hold, self._hold = self._hold, False
            weights = self._weights.setdefault(key, np.full((16, 16), 0.5))
        self.started.set()
        if hold and not self.release.wait(10):
            raise TimeoutError("gate was never released")
        inputs = np.ones((len(request_ids), 16))
        if not np.isfinite(inputs @ weights).all():
            raise FloatingPointError("model produced non-finite outputs")


def test_every_request_is_reported_exactly_once_under_concurrent_submitters():
    outcomes, model = Outcomes(), GatedModel()
    submitted = Counter()
    with AffinityScheduler(model, outcomes, lanes=2, max_batch_size=4, queue_capacity=64) as s:

        def submit_many(first_id: int) -> None:
            for i in range(first_id, first_id + 300):
                s.submit(i, f"bucket{i % 5}", priority=i % 2, timeout_s=0.5, size=1 + i % 7)
                submitted[i] += 1

        threads = [threading.Thread(target=submit_many, args=(t * 1000,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sum(submitted.values()) == 1200
    counts = Counter(request_id for request_id, _ in outcomes.calls)
    assert set(counts) == set(submitted)
    assert set(counts.values()) == {1}
    errors = {error for _, error in outcomes.calls if error is not None}
    assert errors <= set(REJECT_REASONS)
    # Every batch held one key and at most max_batch_size requests.
    for key, ids, _lane in model.batches:
        assert 1 <= len(ids) <= 4
        assert {f"bucket{i % 5}" for i in ids} == {key}


def test_higher_priority_then_earliest_deadline_runs_first():
    outcomes, model = Outcomes(), GatedModel(hold_first=True)
    with AffinityScheduler(model, outcomes, lanes=1, max_batch_size=1, max_window_s=0) as s:
        s.submit(0, "gate")
        assert model.started.wait(5)
        s.submit(1, "m", priority=0, timeout_s=1.0)
        s.submit(2, "m", priority=1, timeout_s=5.0)
        s.submit(3, "m", priority=1, timeout_s=2.0)
        s.submit(4, "m", priority=0, timeout_s=0.5)
        model.release.set()
    assert [ids[0] for _, ids, _ in model.batches] == [0, 3, 2, 4, 1]


def test_admission_rejects_at_once_with_the_reason():
    outcomes, model = Outcomes(), GatedModel(hold_first=True)
    with AffinityScheduler(model, outcomes, queue_capacity=2, max_batch_bytes=100) as s:
        assert s.submit(0, "gate") is None
        assert model.started.wait(5)
        assert s.submit(1, "k", size=101) == "too_large"
        assert s.submit(2, "k", timeout_s=0.0) == "deadline_passed"
        assert s.submit(3, "k") is None
        assert s.submit(4, "k") is None
        assert s.submit(5, "k") == "queue_full"
        # A higher priority request displaces the least urgent queued one.
        assert s.submit(6, "k", priority=2) is None
        model.release.set()
    outcomes.wait_for(7)
    result = outcomes.by_id()
    assert result == {
        0: None, 1: "too_large", 2: "deadline_passed", 3: None, 4: "displaced",
        5: "queue_full", 6: None,
    }
    metrics = s.metrics()
    assert metrics["rejections"] == {
        "too_large": 1, "deadline_passed": 1, "queue_full": 1, "displaced": 1,
    }


def test_a_displaced_request_is_answered_before_submit_returns_while_the_lanes_are_busy():
    """Its client hears at once, not when the busy lane next looks at the queue."""
    outcomes, model = Outcomes(), GatedModel(hold_first=True)
    with AffinityScheduler(model, outcomes, queue_capacity=2) as s:
        s.submit(0, "gate")
        assert model.started.wait(5)   # the only lane is held on its first batch
        s.submit(1, "k")
        s.submit(2, "k")
        assert s.submit(3, "k", priority=1) is None
        assert outcomes.by_id() == {2: "displaced"}  # the newest of the lowest priority
        model.release.set()
    outcomes.wait_for(4)
    assert outcomes.by_id() == {0: None, 1: None, 2: "displaced", 3: None}


def test_a_request_whose_deadline_passes_in_the_queue_is_rejected_not_run():
    outcomes, model = Outcomes(), GatedModel(hold_first=True)
    with AffinityScheduler(model, outcomes) as s:
        s.submit(0, "gate")
        assert model.started.wait(5)
        s.submit(1, "k", timeout_s=0.02)
        s.submit(2, "k", timeout_s=5.0)
        time.sleep(0.05)
        model.release.set()
    assert outcomes.by_id() == {0: None, 1: "deadline_expired", 2: None}
    assert all(1 not in ids for _, ids, _ in model.batches)


def test_a_failing_model_call_fails_each_request_of_its_batch_once():
    outcomes = Outcomes()

    def model(key, request_ids, lane):
        if key == "broken":
            raise ValueError("weights missing for 'broken'")

    with AffinityScheduler(model, outcomes, max_window_s=0) as s:
        for i in range(3):
            s.submit(i, "broken")
        s.submit(10, "fine")
    result = outcomes.by_id()
    assert result[10] is None
    for i in range(3):
        assert result[i] == "execute_failed: ValueError: weights missing for 'broken'"
    assert len(outcomes.calls) == 4


def test_close_without_drain_rejects_queued_requests_and_later_submits_raise():
    outcomes, model = Outcomes(), GatedModel(hold_first=True)
    s = AffinityScheduler(model, outcomes)
    s.submit(0, "gate")
    assert model.started.wait(5)
    s.submit(1, "k")
    s.submit(2, "j")
    releaser = threading.Timer(0.05, model.release.set)
    releaser.start()
    s.close(drain=False)
    releaser.join()
    assert outcomes.by_id() == {0: None, 1: "shutdown", 2: "shutdown"}
    assert s.closed
    with pytest.raises(RuntimeError, match="closed"):
        s.submit(3, "k")
    s.close()  # closing twice is harmless


def test_prefetch_is_told_the_next_batch_while_the_current_one_runs():
    outcomes, model = Outcomes(), GatedModel(hold_first=True)
    staged: list[tuple[str, list[int]]] = []
    lock = threading.Lock()

    def prefetch(key, request_ids, lane):
        with lock:
            staged.append((key, list(request_ids)))

    with AffinityScheduler(model, outcomes, prefetch=prefetch, max_window_s=0) as s:
        s.submit(0, "gate")
        assert model.started.wait(5)
        s.submit(1, "next")
        s.submit(2, "next")
        s.submit(3, "later")
        model.release.set()
    assert ("later", [3]) in staged  # announced while "next" was about to run
    assert model.batches[1][0] == "next"


def test_keys_stay_on_their_lane_and_metrics_report_it():
    outcomes, model = Outcomes(), GatedModel()
    with AffinityScheduler(model, outcomes, lanes=2, max_window_s=0) as s:
        for round_ in range(20):
            for k, key in enumerate(("a", "b")):
                s.submit(round_ * 2 + k, key)
                outcomes.wait_for(round_ * 2 + k + 1)
    lanes_by_key: dict[str, set[int]] = {}
    for key, _, lane in model.batches:
        lanes_by_key.setdefault(key, set()).add(lane)
    # One request at a time never queues two, so nothing is stolen and each key stays home.
    assert len(lanes_by_key["a"]) == 1 and len(lanes_by_key["b"]) == 1
    metrics = s.metrics()
    assert metrics["affinity_hit_rate"] == 1.0
    assert metrics["completed"] == 40
    assert sum(metrics["batch_size_histogram"].values()) == metrics["batches"]
    assert metrics["latency_s"][0]["count"] == 40
    assert 0 < metrics["latency_s"][0]["p50"] <= metrics["latency_s"][0]["p99"] < 5
    assert set(metrics["queue_depth"]) == set(range(PRIORITY_LEVELS))
    assert 0.0 <= metrics["timeout_flush_share"] <= 1.0


def test_lanes_pin_to_cpus_or_warn_why_not():
    outcomes, model = Outcomes(), GatedModel()
    with pytest.warns(RuntimeWarning, match="lane 1 runs unpinned"):
        s = AffinityScheduler(model, outcomes, lanes=[[0], [100000]])
    with s:
        assert s.lanes == 2
        pinned, why = s.pinning()[1]
        assert not pinned and "100000" in why
        s.submit(1, "k")
    assert outcomes.by_id() == {1: None}


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"lanes": 0}, ValueError, "lanes must be at least 1"),
        ({"lanes": [["0"]]}, ValueError, "CPU ids are ints"),
        ({"lanes": "two"}, TypeError, "lane count"),
        ({"max_batch_size": 0}, ValueError, "max_batch_size must be at least 1"),
        ({"max_window_s": -1}, ValueError, "max_window must be in"),
        ({"target_utilization": 1.5}, ValueError, "target_utilization"),
        ({"prefetch": 3}, TypeError, "prefetch must be callable"),
    ],
)
def test_bad_configuration_is_refused_with_a_clear_error(kwargs, error, message):
    with pytest.raises(error, match=message):
        AffinityScheduler(GatedModel(), Outcomes(), **kwargs)


def test_bad_requests_are_refused_with_a_clear_error():
    outcomes, model = Outcomes(), GatedModel(hold_first=True)
    with AffinityScheduler(model, outcomes) as s:
        with pytest.raises(TypeError, match="execute must be callable"):
            AffinityScheduler(None, outcomes)
        with pytest.raises(ValueError, match="priority must be in"):
            s.submit(1, "k", priority=PRIORITY_LEVELS)
        with pytest.raises(ValueError, match="affinity_key must be a non-empty string"):
            s.submit(1, "")
        with pytest.raises(ValueError, match="NaN"):
            s.submit(1, "k", timeout_s=float("nan"))
        assert s.submit(1, "k") is None
        with pytest.raises(ValueError, match="already queued or running"):
            s.submit(1, "k")
        model.release.set()
    assert outcomes.by_id() == {1: None}
