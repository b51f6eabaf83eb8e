"""The streaming scheduler's queue: who joins, who leaves without joining, and that an
iteration looks only at the streams it must (deadlines that passed; a sweep when asked)."""

from latte.backend.options import RequestOptions
from latte.backend.streaming.controls import StreamControls
from latte.backend.streaming.scheduler import StreamScheduler
from latte.backend.streaming.streams import Stream


def stream(arrival=0.0, **options):
    return Stream({}, StreamControls(options=RequestOptions(**options)), arrival)


def test_only_the_streams_whose_deadline_passed_leave_and_the_rest_keep_their_order():
    scheduler = StreamScheduler(max_streams=4, joins_per_iteration=1, max_waiting=100)
    patient = [stream() for _ in range(50)]
    hasty = [stream(timeout_ms=5.0) for _ in range(3)]
    for s in [*patient[:10], *hasty, *patient[10:]]:
        scheduler.add(s)
    plan = scheduler.schedule(now=0.001, running=0)
    assert plan.joins == [patient[0]] and not plan.expired
    plan = scheduler.schedule(now=0.010, running=1)
    assert plan.joins == [patient[1]] and sorted(plan.expired, key=lambda s: s.number) == hasty
    assert scheduler.waiting == 48 and scheduler.waiting_streams()[0] is patient[2]


def test_a_waiting_stream_whose_client_gave_up_leaves_at_the_sweep_or_at_the_head():
    scheduler = StreamScheduler(max_streams=8, joins_per_iteration=1, max_waiting=100)
    streams = [stream() for _ in range(6)]
    for s in streams:
        scheduler.add(s)
    streams[4].cancelled = True
    plan = scheduler.schedule(now=0.0, running=0)       # no sweep asked: the queue is not scanned
    assert plan.joins == [streams[0]] and not plan.cancelled and scheduler.waiting == 5
    plan = scheduler.schedule(now=0.0, running=1, sweep=True)
    assert plan.joins == [streams[1]] and plan.cancelled == [streams[4]] and scheduler.waiting == 3
    streams[2].cancelled = True                         # at the head: it leaves as it would join
    plan = scheduler.schedule(now=0.0, running=2)
    assert plan.joins == [streams[3]] and plan.cancelled == [streams[2]]
    assert scheduler.waiting_streams() == [streams[5]]


def test_a_stream_that_joined_before_its_deadline_is_never_reported_expired():
    scheduler = StreamScheduler(max_streams=8, joins_per_iteration=8, max_waiting=100)
    early = stream(timeout_ms=5.0)
    scheduler.add(early)
    assert scheduler.schedule(now=0.001, running=0).joins == [early]
    late = stream(arrival=0.002, timeout_ms=1.0)
    scheduler.add(late)
    plan = scheduler.schedule(now=0.010, running=8)     # no room: late waits past its deadline
    assert plan.expired == [late] and scheduler.waiting == 0
