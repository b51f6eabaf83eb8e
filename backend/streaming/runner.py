"""The iteration loop of a streaming model, on two threads of its own. The *start lane* takes
the streams that arrived, lets the scheduler pick who joins and starts them as one batch (their
first outputs go out then); the *step loop* takes the streams started since its last iteration,
drops those whose clients gave up, and steps every stream it holds as one batch. A stream that
arrives while a step runs starts at once, beside it, instead of waiting for the step to end: a
step runs mostly outside the GIL, so on a second core, or in the step's waits, the start goes
on. Each part's emissions, made into responses (`prepare`), go to the outboxes, whose readers
send them (the model's sender threads, so the next iteration computes while they go out). Each
send is a round trip to the server that waits for its answer: several senders keep several in
flight, as a thread per request does. A stream's emissions all go to one outbox (by its
number), so they leave in order: its first is posted before the step loop can hold it; and a
stream's first ones go ahead of the running streams' backlog there (outbox.py).

Data flows one way: submit -> schedule -> start -> (handed over) -> step -> outbox. Nothing here
calls back; a stream found cancelled by the sender is a flag on the stream, read at the next
iteration. `run_once` runs both parts in turn on the caller's thread (tests, the in-process
bound, the profiler).
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable, Deque, List, NamedTuple, Optional, Sequence

from latte.backend.errors import DeadlineExceeded, Overloaded, RequestCancelled
from latte.backend.streaming.engine import Emission, Outcome, StreamEngine
from latte.backend.streaming.outbox import Outbox
from latte.backend.streaming.scheduler import StreamScheduler
from latte.backend.streaming.streams import Stream

# Lists of each kind an outbox holds (outbox.py): past it the loop waits, so a slow client
# side cannot make outputs pile up in memory. An iteration posts at most one list of each
# kind to an outbox (its openings; its step's outputs, with the running streams it found
# cancelled before them), so the loop runs this many iterations ahead of senders slower than
# it: two, so that one iteration's responses go out while the next is computed, and no more,
# since a newcomer's second output waits behind them.
OUTBOX_ITERATIONS = 2
# Spreads the streams' first cancellation questions over half an interval (Weyl's sequence).
_GOLDEN = 0.6180339887498949
# How a stream that ended with an error is counted; any other error is the model's failure.
_ENDED_BY = {RequestCancelled: "cancelled", DeadlineExceeded: "expired", Overloaded: "refused"}


# How long the start lane waits before it looks again at streams that wait for room (a slot,
# cache blocks) when nothing wakes it: their deadlines and cancellations are read then.
WAITING_RECHECK_S = 0.005


class Admitted(NamedTuple):
    """What `admit` gives: `openings`, each a stream's first emission (refused, expired or
    cancelled before it started, or a join's first output); `started`, the streams that hold
    their state now, for the step loop to take over."""
    openings: List[Emission]
    started: List[Stream]


class Collected(NamedTuple):
    """What `collect` gives: `cancelled`, the running streams' last emissions (their earlier
    outputs may still wait to be sent); `running`, the streams `advance` steps."""
    cancelled: List[Emission]
    running: List[Stream]


class Ready(NamedTuple):
    """An outcome already made into what the sender sends (the runner's `prepare`): an output,
    or an error (`output` False)."""
    response: object
    output: bool = True


def _next_check(due: float, now: float, interval: float) -> float:
    """The first time after `now` on the stream's own schedule (due + k intervals), not `now`
    plus an interval: streams asked in one iteration would keep one time from then on, and
    drift into one group as iterations vary in length."""
    if interval <= 0:
        return now
    return due + interval * (1 + (now - due) // interval)


def _is_cancelled(stream: Stream) -> bool:
    request = stream.request
    if request is None:
        return False
    try:
        return bool(request.is_cancelled())
    except Exception:  # a stub without cancellation: the client's going shows when a send fails
        return False


class StreamRunner:
    def __init__(self, engine: StreamEngine, scheduler: StreamScheduler, cancel_check_s: float = 0.1,
                 clock: Callable[[], float] = time.monotonic,
                 is_cancelled: Callable[[Stream], bool] = _is_cancelled, outboxes: int = 1,
                 prepare: Optional[Callable[[Outcome], object]] = None) -> None:
        self.engine = engine
        self.prepare = prepare
        self.scheduler = scheduler
        self.clock = clock
        self.is_cancelled = is_cancelled
        self.cancel_check_s = cancel_check_s
        self._next_check = 0.0
        self._inbox: Deque[Stream] = collections.deque()
        self._started: Deque[Stream] = collections.deque()   # started, not yet held by the step loop
        self._wake = threading.Condition()       # the start lane's: arrivals, room freed, closing
        self._stepping = threading.Condition()   # the step loop's: streams started, closing
        self._room_freed = False
        self._closing = False
        self.outboxes = [Outbox(OUTBOX_ITERATIONS) for _ in range(outboxes)]
        self.iterations = 0
        # Each part counts in its own, so no count is written from two threads.
        self._start_figures = {"joined": 0, "finished": 0, "cancelled": 0, "expired": 0, "refused": 0, "failed": 0,
                               "outputs": 0}
        self._step_figures = dict.fromkeys(self._start_figures, 0)
        self._threads: List[threading.Thread] = []

    @property
    def figures(self) -> dict:
        """Running totals: streams joined, finished, cancelled, expired, refused, failed; outputs."""
        return {key: value + self._step_figures[key] for key, value in self._start_figures.items()}

    # -- feeding ------------------------------------------------------------------------
    def submit(self, streams: Sequence[Stream]) -> None:
        with self._wake:
            self._inbox.extend(streams)
            self._wake.notify()

    def start(self, name: str) -> None:
        self._threads = [threading.Thread(target=self._step_loop, name=f"latte-streams-{name}", daemon=True),
                         threading.Thread(target=self._start_loop, name=f"latte-stream-starts-{name}", daemon=True)]
        for thread in self._threads:
            thread.start()

    # -- one iteration ------------------------------------------------------------------
    def run_once(self) -> List[Emission]:
        """One iteration of both parts on this thread: the streams started before join, those
        whose clients gave up leave; newcomers start (their first outputs); then a step of every
        stream held before they started."""
        cancelled, running = self.collect()
        openings, started = self.admit()
        for stream in started:
            self.engine.join(stream)
        return openings + cancelled + self.advance(running)

    def admit(self) -> Admitted:
        """The start lane's part. The streams that arrived queue; those whose clients gave up or
        that waited too long leave; the scheduler's joins start, each getting its state and its
        first output."""
        now = self.clock()
        interval = self.cancel_check_s
        openings: List[Emission] = []
        while self._inbox:
            stream = self._inbox.popleft()
            # Its first question after at least half an interval, spread by its number, so
            # that streams which came together are not all asked in the same iteration.
            stream.check_at = stream.arrival + interval * (0.5 + 0.5 * ((stream.number * _GOLDEN) % 1.0))
            if not self.scheduler.add(stream):
                openings.append((stream, Overloaded(
                    f"{self.scheduler.waiting} streams are waiting to join (max_waiting); try again later"), True))
        # The waiting streams are asked together every interval, which spares a scan of the
        # queue at every pass.
        checked = now >= self._next_check
        if checked:
            self._next_check = now + interval
            self._ask(self.scheduler.waiting_streams(), now)
        free = self.engine.cache.free if self.engine.cache is not None else None
        plan = self.scheduler.schedule(now, self.engine.holding, free, sweep=checked)
        for stream in plan.cancelled:
            openings.append((stream, RequestCancelled("the client cancelled the stream before it started"), True))
        for stream in plan.expired:
            waited = (now - stream.arrival) * 1000
            openings.append((stream, DeadlineExceeded(
                f"timed out: waited {waited:.1f} ms to start, longer than timeout_ms="
                f"{stream.controls.options.timeout_ms:g}"), True))
        if plan.joins:
            openings.extend(self.engine.start(plan.joins))
        self._start_figures["joined"] += len(plan.joins)
        self._count(openings, self._start_figures)
        return Admitted(openings, [stream for stream in plan.joins if not stream.ended])

    def hand_over(self, started: Sequence[Stream]) -> None:
        """Streams `admit` started, for the step loop to hold from its next iteration on."""
        with self._stepping:
            self._started.extend(started)
            self._stepping.notify()

    def collect(self) -> Collected:
        """The step loop's part before its step: the streams started since join; those whose
        clients gave up leave."""
        engine = self.engine
        while self._started:
            engine.join(self._started.popleft())
        # Each question is a round trip to the server that holds the loop up: each running
        # stream is asked once an interval on its own clock, so an iteration asks a few, not all
        # of them at once (a stall every interval that would show in inter-token P99).
        self._ask(engine.live, self.clock())
        cancelled: List[Emission] = []
        for stream in [s for s in engine.live if s.cancelled]:
            engine.drop(stream)
            cancelled.append((stream, RequestCancelled("the client cancelled the stream"), True))
        self._count(cancelled, self._step_figures)
        return Collected(cancelled, list(engine.live))

    def _ask(self, streams: Sequence[Stream], now: float) -> None:
        """Whether each client gave up, of the streams whose time to ask has come."""
        for stream in streams:
            if now >= stream.check_at and not stream.cancelled:
                stream.check_at = _next_check(stream.check_at, now, self.cancel_check_s)
                if self.is_cancelled(stream):  # a sender may mark it too: never unmarked here
                    stream.cancelled = True

    def advance(self, running: Sequence[Stream]) -> List[Emission]:
        """A step of `running`, the streams `collect` gave: each one's next output."""
        emissions = self.engine.step(running) if running else []
        self._count(emissions, self._step_figures)
        self.iterations += 1
        return emissions

    @staticmethod
    def _count(emissions: List[Emission], figures: dict) -> None:
        for _, outcome, final in emissions:
            if isinstance(outcome, Exception):
                figures[_ENDED_BY.get(type(outcome), "failed")] += 1
            else:
                figures["outputs"] += outcome is not None
                figures["finished"] += final

    @property
    def idle(self) -> bool:
        return not self._inbox and not self._started and not self.engine.live and not self.scheduler.waiting

    # -- the threads --------------------------------------------------------------------
    def _start_loop(self) -> None:
        full = self.scheduler.joins_per_iteration
        while True:
            with self._wake:
                # Streams that wait for room are looked at again when the step loop frees some,
                # or after a short while (their deadlines); a full batch of joins, at once.
                if not self._inbox and not self._room_freed and not self._closing:
                    self._wake.wait(WAITING_RECHECK_S if self.scheduler.waiting else None)
                self._room_freed = False
                if self._closing:
                    return
            openings, started = self.admit()
            if openings:
                # Before the step loop holds the streams, so that nothing of theirs is posted ahead.
                self._post(openings, opening=True)
            if started:
                self.hand_over(started)
            if len(started) >= full:
                with self._wake:
                    self._room_freed = True

    def _step_loop(self) -> None:
        while True:
            with self._stepping:
                while not self._started and not self.engine.live and not self._closing:
                    self._stepping.wait()
                if self._closing:
                    break
            cancelled, running = self.collect()
            stepped = cancelled + self.advance(running)
            if stepped:
                self._post(stepped)
                if self.scheduler.waiting and any(final for _, _, final in stepped):
                    with self._wake:  # room for a waiting stream
                        self._room_freed = True
                        self._wake.notify()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()
        self._post(self._unloading())
        for outbox in self.outboxes:
            outbox.put(None)

    def _post(self, emissions: List[Emission], opening: bool = False) -> None:
        """The emissions to the outboxes, each stream's to its own."""
        emissions = self._ready(emissions)
        count = len(self.outboxes)
        if count == 1:
            self.outboxes[0].put(emissions, opening)
            return
        shares: List[List[Emission]] = [[] for _ in range(count)]
        for emission in emissions:
            shares[emission[0].number % count].append(emission)
        for outbox, share in zip(self.outboxes, shares):
            if share:
                outbox.put(share, opening)

    def _ready(self, emissions: List[Emission]) -> List[Emission]:
        """The responses made here (`prepare`), so that the senders only send: made while the
        outputs are fresh in this thread's caches, and with no hand-over of the GIL to a sender
        between its making and its send (docs/streaming.md has the figures)."""
        prepare = self.prepare
        if prepare is None:
            return emissions
        ready: List[Emission] = []
        for stream, outcome, final in emissions:
            if outcome is not None:
                try:
                    outcome = Ready(prepare(outcome), not isinstance(outcome, Exception))
                except Exception:  # left to the sender, which ends the stream if it cannot either
                    pass
            ready.append((stream, outcome, final))
        return ready

    def _unloading(self) -> List[Emission]:
        """Every stream still running or waiting ends with an error: the model is unloading."""
        emissions = []
        for stream in [*self.engine.live, *self._started, *self.scheduler.drain(), *self._inbox]:
            self.engine.drop(stream)
            emissions.append((stream, RequestCancelled("the model is unloading"), True))
        self._inbox.clear()
        self._started.clear()
        return emissions

    def close(self, timeout: float = 5.0) -> None:
        for condition in (self._wake, self._stepping):
            with condition:
                self._closing = True
                condition.notify_all()
        for thread in self._threads:
            thread.join(timeout)
