import numpy as np
import pytest

from latte.backend.buckets import BucketPlan
from latte.backend.errors import RequestError
from latte.backend.options import read_options
from latte.backend.sessions import SessionStore


def test_request_parameters_become_options():
    opts = read_options({"priority_level": 2, "timeout_ms": "50", "session_id": "chat-1", "session_start": "true"})
    assert (opts.priority, opts.timeout_ms, opts.session_id, opts.session_start, opts.session_end) == \
        (2, 50.0, "chat-1", True, False)
    assert read_options({}).priority == 0 and read_options({}).timeout_ms is None


@pytest.mark.parametrize("params, message", [
    ({"priority_level": -1}, "'priority_level' must be an integer from 0 to 15"),
    ({"priority_level": "high"}, "'priority_level' must be an integer"),
    ({"priority_level": "\u00b2"}, "'priority_level' must be an integer from 0 to 15, got '\u00b2'"),
    ({"timeout_ms": 0}, "'timeout_ms' must be > 0"),
    ({"timeout_ms": "soon"}, "'timeout_ms' must be a number"),
    ({"session_end": True}, "need a session_id"),
    ({"session_id": "a", "session_start": "maybe"}, "'session_start' must be a boolean"),
])
def test_bad_options_are_request_errors(params, message):
    with pytest.raises(RequestError, match=message):
        read_options(params)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def tokens(*values):
    return np.array([values], dtype=np.int64)


def test_a_session_runs_each_request_on_its_prefix_and_ends_explicitly():
    store = SessionStore(ttl_s=10, max_sessions=4, max_length=8)
    first = store.extend("s", tokens(1, 2), start=True)
    store.commit(first)
    second = store.extend("s", tokens(3), start=False, end=True)
    np.testing.assert_array_equal(second.sequence, [[1, 2, 3]])
    store.commit(second)
    assert store.stats().live == 0 and store.stats().ended == 1
    with pytest.raises(RequestError, match="unknown session 's'"):
        store.extend("s", tokens(4), start=False)


def test_idle_sessions_are_reclaimed_after_the_ttl():
    clock = Clock()
    store = SessionStore(ttl_s=5, max_sessions=100, max_length=None, clock=clock)
    for i in range(50):  # clients that start a session and vanish
        store.commit(store.extend(f"abandoned-{i}", tokens(1), start=True))
    assert store.stats().live == 50
    clock.now = 5.5
    assert store.reap() == 50
    assert store.stats().live == 0 and store.stats().expired == 50


def test_sessions_are_bounded_in_count_and_length():
    store = SessionStore(ttl_s=5, max_sessions=1, max_length=3)
    store.commit(store.extend("a", tokens(1, 2), start=True))
    with pytest.raises(RequestError, match="too many open sessions"):
        store.extend("b", tokens(1), start=True)
    with pytest.raises(RequestError, match="would reach 4 tokens; the model takes at most 3"):
        store.extend("a", tokens(3, 4), start=False)
    with pytest.raises(RequestError, match="already open"):
        store.extend("a", tokens(3), start=True)


def test_a_session_being_started_counts_against_the_limit_before_its_answer():
    store = SessionStore(ttl_s=5, max_sessions=2, max_length=None)
    first = store.extend("a", tokens(1), start=True)
    store.extend("b", tokens(1), start=True)  # both in flight, neither answered yet
    with pytest.raises(RequestError, match=r"too many open sessions \(2\)"):
        store.extend("c", tokens(1), start=True)
    store.release(first)  # "a" failed: it opened nothing, and its place is free again
    store.extend("c", tokens(1), start=True)
    assert store.stats().live == 0 and store.in_flight() == 2


def test_a_sessions_next_request_waits_for_the_answer_to_the_one_in_flight():
    store = SessionStore(ttl_s=5, max_sessions=4, max_length=None)
    store.commit(store.extend("s", tokens(1), start=True))
    second = store.extend("s", tokens(2), start=False)
    with pytest.raises(RequestError) as refused:
        store.extend("s", tokens(3), start=False)
    assert str(refused.value) == "session 's' has a request in flight; send its next request after that one's answer"
    store.commit(second)
    np.testing.assert_array_equal(store.extend("s", tokens(3), start=False).sequence, [[1, 2, 3]])


def test_a_released_turn_leaves_its_session_as_it_was():
    store = SessionStore(ttl_s=5, max_sessions=4, max_length=None)
    store.commit(store.extend("s", tokens(1), start=True))
    failed = store.extend("s", tokens(2), start=False)
    store.release(failed)
    np.testing.assert_array_equal(store.extend("s", tokens(3), start=False).sequence, [[1, 3]])


def test_a_turn_never_settled_is_forgotten_after_the_ttl():
    clock = Clock()
    store = SessionStore(ttl_s=5, max_sessions=1, max_length=None, clock=clock)
    lost = store.extend("s", tokens(1), start=True)
    clock.now = 5.5
    store.extend("t", tokens(1), start=True)  # the lost start no longer holds the one place
    store.commit(lost)  # its late answer opens nothing
    assert store.stats().live == 0 and store.in_flight() == 1


def test_a_late_answer_of_a_forgotten_turn_still_continues_its_session():
    clock = Clock()
    store = SessionStore(ttl_s=5, max_sessions=2, max_length=None, clock=clock)
    store.commit(store.extend("s", tokens(1), start=True))
    slow = store.extend("s", tokens(2), start=False)
    clock.now = 5.5  # the turn ran past the TTL and was forgotten; the session was idle as long
    store.reap()
    store.commit(slow)  # the client got its answer: the session goes on from it
    np.testing.assert_array_equal(store.extend("s", tokens(3), start=False).sequence, [[1, 2, 3]])


def test_a_session_with_a_request_in_flight_does_not_expire():
    clock = Clock()
    store = SessionStore(ttl_s=5, max_sessions=2, max_length=None, clock=clock)
    store.commit(store.extend("s", tokens(1), start=True))
    clock.now = 4.0
    running = store.extend("s", tokens(2), start=False)
    clock.now = 5.5  # idle since its last answer for longer than the TTL, but its turn is 1.5 s old
    assert store.reap() == 0
    store.commit(running)
    assert store.stats().live == 1 and store.stats().started == 1 and store.stats().expired == 0
    np.testing.assert_array_equal(store.extend("s", tokens(3), start=False).sequence, [[1, 2, 3]])


def test_a_late_answer_reopens_its_expired_session_only_while_the_limit_has_room():
    clock = Clock()
    store = SessionStore(ttl_s=5, max_sessions=1, max_length=None, clock=clock)
    store.commit(store.extend("s", tokens(1), start=True))
    slow = store.extend("s", tokens(2), start=False)
    clock.now = 5.5  # the slow turn is forgotten and "s" expires, so "t" takes the one place
    newcomer = store.extend("t", tokens(1), start=True)
    store.commit(slow)
    store.commit(newcomer)
    assert store.stats().live == 1
    with pytest.raises(RequestError, match="unknown session 's'"):
        store.extend("s", tokens(3), start=False)


def test_a_late_answer_leaves_a_session_started_anew_under_its_id_alone():
    clock = Clock()
    store = SessionStore(ttl_s=5, max_sessions=4, max_length=None, clock=clock)
    store.commit(store.extend("s", tokens(1), start=True))
    slow = store.extend("s", tokens(2), start=False, end=True)
    clock.now = 5.5  # the slow turn is forgotten and "s" expires; its client starts "s" again
    store.commit(store.extend("s", tokens(7), start=True))
    store.commit(slow)  # the old turn's answer neither rewrites nor ends the new session
    np.testing.assert_array_equal(store.extend("s", tokens(8), start=False).sequence, [[7, 8]])


def test_bucket_edges_default_to_powers_of_two_up_to_the_maximum():
    plan = BucketPlan.default(100)
    assert plan.edges == [16, 32, 64, 100]
    assert [plan.edge_for(n) for n in (1, 16, 17, 99, 100, 130)] == [16, 16, 32, 100, 100, 130]
    with pytest.raises(ValueError, match="comma-separated"):
        BucketPlan.parse("8,x")


def test_tritons_own_request_timeout_applies_when_no_timeout_ms_is_given():
    assert read_options({}, triton_timeout_us=2500).timeout_ms == 2.5
    assert read_options({"timeout_ms": 7}, triton_timeout_us=2500).timeout_ms == 7.0


def test_every_priority_level_the_options_admit_is_one_the_native_scheduler_takes():
    from latte.backend.options import MAX_PRIORITY, read_options
    from latte.scheduling import PRIORITY_LEVELS, AffinityScheduler

    assert MAX_PRIORITY == PRIORITY_LEVELS - 1 == 15  # the documented 0-15
    assert read_options({"priority_level": MAX_PRIORITY}).priority == MAX_PRIORITY
    done = []
    scheduler = AffinityScheduler(lambda key, ids, lane: None, lambda rid, error: done.append((rid, error)), lanes=1)
    try:
        assert scheduler.submit(1, "k", priority=MAX_PRIORITY) is None
    finally:
        scheduler.close(drain=True)
    assert done == [(1, None)]
