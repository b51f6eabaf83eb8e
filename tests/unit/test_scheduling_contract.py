"""The C++ <-> Python contract of the scheduler: limits and names come from latte._native and
every Python user agrees with them. Each test fails when one side changes without the other."""

from __future__ import annotations

import pytest

from latte import _native
from latte.backend import lanes
from latte.backend.options import MAX_PRIORITY, RequestError, read_options
from latte.scheduling import PRIORITY_LEVELS, REJECT_REASONS, AffinityScheduler, RejectReason

# What each reason means to a client, written out once here on purpose: renaming, adding or
# dropping a reason in request.hpp fails test_every_reason_the_core_reports_is_one_the_backend_maps.
CLIENT_ERROR_OF_REASON = {
    "queue_full": "Overloaded",
    "displaced": "Overloaded",
    "shutdown": "Overloaded",
    "deadline_passed": "DeadlineExceeded",
    "deadline_expired": "DeadlineExceeded",
    "too_large": "RequestError",
    "execute_failed": "ModelError",
}


MAX_BATCH_SIZE = 4
MAX_BATCH_BYTES = 1024


@pytest.fixture
def scheduler():
    """An idle one-lane scheduler; nothing submitted to it runs (max_window_s only bounds waits)."""
    with AffinityScheduler(lambda key, ids, lane: None, lambda request_id, error: None,
                           max_batch_size=MAX_BATCH_SIZE, max_batch_bytes=MAX_BATCH_BYTES) as s:
        yield s


def test_latte_scheduling_re_exports_the_native_limits_and_names():
    assert PRIORITY_LEVELS is _native.PRIORITY_LEVELS
    assert REJECT_REASONS is _native.REJECT_REASONS
    assert RejectReason is _native.RejectReason
    assert PRIORITY_LEVELS == 16


def test_the_reason_strings_are_the_enum_member_names():
    assert REJECT_REASONS == tuple(reason.name for reason in RejectReason)


def test_every_reason_the_core_reports_is_one_the_backend_maps():
    assert set(REJECT_REASONS) == set(CLIENT_ERROR_OF_REASON)
    from latte.backend.engine import Work
    from latte.backend.options import RequestOptions
    from latte.backend.requests import ParsedRequest

    waiting = Work(0, ParsedRequest(inputs={}, rows=1), RequestOptions(timeout_ms=5.0), arrival=0.0)
    for reason, error in CLIENT_ERROR_OF_REASON.items():
        refused = lanes.refusal("m", 4, f"{reason}: detail", waiting, now=0.01)
        assert type(refused) is getattr(lanes, error), reason


def test_the_backend_admits_exactly_the_priorities_the_scheduler_accepts(scheduler):
    assert MAX_PRIORITY == PRIORITY_LEVELS - 1
    assert read_options({"priority_level": PRIORITY_LEVELS - 1}).priority == PRIORITY_LEVELS - 1
    with pytest.raises(RequestError, match=f"from 0 to {PRIORITY_LEVELS - 1}"):
        read_options({"priority_level": PRIORITY_LEVELS})
    assert scheduler.submit(1, "k", priority=PRIORITY_LEVELS - 1) is None
    with pytest.raises(ValueError, match=rf"priority must be in \[0, {PRIORITY_LEVELS - 1}\], got {PRIORITY_LEVELS}"):
        scheduler.submit(2, "k", priority=PRIORITY_LEVELS)


def test_a_refusal_reports_the_enum_name(scheduler):
    assert scheduler.submit(3, "k", size=MAX_BATCH_BYTES + 1) == RejectReason.too_large.name


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_batch_size": 0}, "max_batch_size must be at least 1, got 0"),
        ({"max_batch_bytes": -1}, "max_batch_bytes must not be negative, got -1"),
        ({"queue_capacity": 0}, "queue_capacity must be at least 1"),
        ({"max_window_s": 10.5}, r"max_window must be in \[0, 10\] seconds, got 10.5"),
        ({"max_window_s": float("nan")}, "max_window_s must not be NaN"),
        ({"target_utilization": 0.0}, r"target_utilization must be in \(0, 1\]"),
    ],
)
def test_the_native_core_alone_checks_the_numbers_and_names_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AffinityScheduler(lambda *a: None, lambda *a: None, **kwargs)


@pytest.mark.parametrize("value", [True, 2.0, "8"])
def test_counts_must_be_ints(value):
    with pytest.raises(TypeError, match=f"max_batch_size must be an int, got {value!r}"):
        AffinityScheduler(lambda *a: None, lambda *a: None, max_batch_size=value)


def test_seed_latency_is_bound_and_checked_by_the_core(scheduler):
    scheduler.seed_latency("k", 1, 0.002)
    scheduler.seed_latency("k", 2, 0.003)
    with pytest.raises(ValueError, match=r"batch_size must be in \[1, max_batch_size\]"):
        scheduler.seed_latency("k", MAX_BATCH_SIZE + 1, 0.001)
    with pytest.raises(ValueError, match="latency must be >= 0"):
        scheduler.seed_latency("k", 1, -1.0)
