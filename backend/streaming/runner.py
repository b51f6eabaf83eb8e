"""The iteration loop of a streaming model, on a thread of its own: take the streams that
arrived, drop those whose clients gave up, let the scheduler pick who joins, start them (their
first outputs go out then, not after the step) and step every stream already running; each
part's emissions, made into responses (`prepare`), go to the outboxes, whose readers send
them (the model's sender threads, so the next iteration computes while they go out). Each
send is a round trip to the server that waits for its answer: several senders keep several in
flight, as a thread per request does. A stream's emissions all go to one outbox (by its
number), so they leave in order; a stream's first ones go ahead of the running streams'
backlog there (outbox.py). When the loop has nothing to step before a lone newcomer's own
first step (one stream at a time, say), it sends its first output itself (`send`): a sender's
wake-up is a large part of a lone first token's time.

Data flows one way: submit -> schedule -> start/step -> outbox. Nothing here calls back; a
stream found cancelled by the sender is a flag on the stream, read at the next iteration.
"""

from __future__ import annotations

import collections
import math
import threading
import time
import traceback
from typing import Callable, Deque, List, NamedTuple, Optional, Sequence

from latte.backend.batch_runner import failure_text
from latte.backend.errors import DeadlineExceeded, ModelError, Overloaded, RequestCancelled
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


class Admitted(NamedTuple):
    """What `admit` gives: `openings`, each a stream's first emission (refused, expired or
    cancelled before it started, or a join's first output); `cancelled`, the running streams'
    last (their earlier outputs may still wait to be sent); `running`, the streams running
    before the joins, the ones `advance` steps."""
    openings: List[Emission]
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
                 cancel_checks_per_s: float = math.inf, clock: Callable[[], float] = time.monotonic,
                 is_cancelled: Callable[[Stream], bool] = _is_cancelled, outboxes: int = 1,
                 prepare: Optional[Callable[[Outcome], object]] = None,
                 send: Optional[Callable[[Stream, Outcome, bool], None]] = None,
                 log_error: Callable[[str], None] = lambda line: None) -> None:
        self.engine = engine
        self.log_error = log_error
        self.prepare = prepare
        self.send = send
        self.scheduler = scheduler
        self.clock = clock
        self.is_cancelled = is_cancelled
        if not cancel_checks_per_s > 0:
            raise ValueError(f"cancel_checks_per_s must be > 0, got {cancel_checks_per_s}")
        self.cancel_check_s = cancel_check_s
        self.cancel_checks_per_s = cancel_checks_per_s
        # The waiting streams one sweep (every cancel_check_s) asks at most: its share of the budget.
        self._sweep_most = math.inf if cancel_checks_per_s == math.inf else \
            max(1.0, cancel_checks_per_s * cancel_check_s)
        self._swept_at = float("-inf")  # when the waiting streams were last asked
        self._inbox: Deque[Stream] = collections.deque()
        self._wake = threading.Condition()
        self._closing = False
        self.outboxes = [Outbox(OUTBOX_ITERATIONS) for _ in range(outboxes)]
        self._unposted: List[Emission] = []  # the last step's emissions, the loop thread's alone
        self.iterations = 0
        self.figures = {"joined": 0, "finished": 0, "cancelled": 0, "expired": 0, "refused": 0, "failed": 0,
                        "outputs": 0}
        # What the live streams hold, as the loop left it after its last iteration. The loop's
        # thread alone changes the streams and the pools; a reader on another thread (the metrics
        # publisher) reads this, never the engine mid-iteration, where a stream that has just
        # taken its next row's block, or joined, holds more than its rows need yet.
        self.held = engine.held()
        self._thread: Optional[threading.Thread] = None

    # -- feeding ------------------------------------------------------------------------
    def submit(self, streams: Sequence[Stream]) -> None:
        with self._wake:
            self._inbox.extend(streams)
            self._wake.notify()

    def start(self, name: str) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"latte-streams-{name}", daemon=True)
        self._thread.start()

    # -- one iteration ------------------------------------------------------------------
    def run_once(self) -> List[Emission]:
        """One iteration: who joins (and their first outputs), then a step of every stream that
        was running before they joined."""
        openings, cancelled, running = self.admit()
        return openings + cancelled + self.advance(running)

    def admit(self) -> Admitted:
        """The streams that arrived queue; those whose clients gave up or that waited too long
        leave; the scheduler's joins start. A first output need not wait for the running
        streams' step: it is given here, before `advance`."""
        now = self.clock()
        interval = self.check_interval(len(self.engine.live))
        openings = self._queue_arrivals()
        checked = self._ask_clients(now, interval)
        cancelled = self._drop_cancelled()
        free = self.engine.cache.free if self.engine.cache is not None else None
        plan = self.scheduler.schedule(now, len(self.engine.live), free, sweep=checked)
        openings.extend(self._unstarted_endings(plan, now))
        running = list(self.engine.live)
        if plan.joins:
            openings.extend(self.engine.start(plan.joins))
        self.figures["joined"] += len(plan.joins)
        self._count(openings)
        self._count(cancelled)
        return Admitted(openings, cancelled, running)

    def _queue_arrivals(self) -> List[Emission]:
        """The inbox handed to the scheduler; an arrival it cannot queue ends at once (Overloaded)."""
        # The interval of the running streams once these arrivals have joined them.
        joined = self.check_interval(min(self.scheduler.max_streams, len(self.engine.live) + len(self._inbox)))
        refused: List[Emission] = []
        while self._inbox:
            stream = self._inbox.popleft()
            # Its first question after at least half an interval, spread by its number, so
            # that streams which came together are not all asked in the same iteration.
            stream.check_at = stream.arrival + joined * (0.5 + 0.5 * ((stream.number * _GOLDEN) % 1.0))
            if not self.scheduler.add(stream):
                refused.append((stream, Overloaded(
                    f"{self.scheduler.waiting} streams are waiting to join (max_waiting); try again later"), True))
        return refused

    def _ask_clients(self, now: float, interval: float) -> bool:
        """Whether their clients gave up, asked of the streams due; True when the waiting ones
        were swept too."""
        # Each question is a round trip to the server that holds the loop up: each running
        # stream is asked once an interval on its own clock, so an iteration asks a few, not all
        # of them at once (a stall every interval that would show in inter-token P99). The
        # waiting streams are swept once every cancel_check_s, which spares a scan of the queue
        # at every iteration, and a sweep asks at most its share of cancel_checks_per_s, in the
        # queue's heap order (its head first): a deep queue is asked a slice at a time, never
        # in one burst, and does not slow the running streams' questions.
        self._ask(self.engine.live, now, interval)
        checked = now >= self._swept_at + self.cancel_check_s
        if checked:
            self._swept_at = now
            self._ask(self.scheduler.waiting_streams(), now, interval, self._sweep_most)
        return checked

    def _drop_cancelled(self) -> List[Emission]:
        """The running streams whose clients gave up, out of the engine."""
        cancelled: List[Emission] = []
        for stream in [s for s in self.engine.live if s.cancelled]:
            self.engine.drop(stream)
            ended_by = stream.cancelled if isinstance(stream.cancelled, Exception) else \
                RequestCancelled("the client cancelled the stream")
            cancelled.append((stream, ended_by, True))
        return cancelled

    @staticmethod
    def _unstarted_endings(plan, now: float) -> List[Emission]:
        """The waiting streams the plan ends before they start: cancelled, or past their timeout."""
        endings: List[Emission] = [(stream, RequestCancelled("the client cancelled the stream before it started"), True)
                                   for stream in plan.cancelled]
        for stream in plan.expired:
            waited = (now - stream.arrival) * 1000
            endings.append((stream, DeadlineExceeded(
                f"timed out: waited {waited:.1f} ms to start, longer than timeout_ms="
                f"{stream.controls.options.timeout_ms:g}"), True))
        return endings

    def check_interval(self, streams: int) -> float:
        """How long each of `streams` running streams goes between two questions:
        cancel_check_s, or longer when they would ask more than cancel_checks_per_s a second
        together (the waiting ones are held to as many again). Each question holds up the
        thread of the server's Python backend that hands on every response, for about what a
        response costs it, so their number is kept from growing with the streams."""
        return max(self.cancel_check_s, streams / self.cancel_checks_per_s)

    def _ask(self, streams: Sequence[Stream], now: float, interval: float, most: float = math.inf) -> None:
        """Whether each client gave up, of the streams whose time to ask has come (the first
        `most` of them)."""
        for stream in streams:
            if now >= stream.check_at and not stream.cancelled:
                if most < 1:
                    return
                most -= 1
                stream.check_at = _next_check(stream.check_at, now, interval)
                if self.is_cancelled(stream):  # a sender may mark it too: never unmarked here
                    stream.cancelled = True

    def advance(self, running: Sequence[Stream]) -> List[Emission]:
        """A step of `running`, the streams `admit` gave: each one's next output."""
        emissions = self.engine.step(running) if running else []
        self._count(emissions)
        self.iterations += 1
        self.held = self.engine.held()
        return emissions

    def _count(self, emissions: List[Emission]) -> None:
        figures = self.figures
        for _, outcome, final in emissions:
            if isinstance(outcome, Exception):
                figures[_ENDED_BY.get(type(outcome), "failed")] += 1
            else:
                figures["outputs"] += outcome is not None
                figures["finished"] += final

    @property
    def idle(self) -> bool:
        return not self._inbox and not self.engine.live and not self.scheduler.waiting

    # -- the loop -----------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._wake:
                while self.idle and not self._unposted and not self._closing:
                    self._wake.wait()
                if self._closing:
                    break
            try:
                self._iterate()
            except Exception as exc:  # a defect of latte's own: logged, and no stream is left waiting on it
                self.log_error(f"latte: {self.engine.name}: the iteration loop failed: {type(exc).__name__}: {exc}\n"
                               f"{traceback.format_exc()}")
                self._unposted += self._ended(ModelError(f"model {self.engine.name!r}: the iteration loop failed: "
                                                         f"{failure_text(exc)}"))
        self._post(self._take_unposted() + self._ended(Overloaded(
            f"model {self.engine.name!r} is shutting down: the stream was not finished; retry later")))
        for outbox in self.outboxes:
            outbox.put(None)

    def _iterate(self) -> None:
        """One pass: who joins, the posting of what the last step made, this step (posted now,
        or at the next pass when streams arrived meanwhile)."""
        openings, cancelled, running = self.admit()
        stepped = self._take_unposted()
        if len(openings) == 1 and not running and not stepped and self.send is not None:
            # Nothing to step before the newcomer's own first step: the loop sends its first
            # output itself rather than wake a sender (nothing else of it is queued). A burst
            # goes to the senders, which send several at once.
            self.send(*self._ready(openings)[0])
        elif openings:
            self._post(openings, opening=True)
        if stepped:
            self._post(stepped)
        elif not openings and not running and (self.engine.live or self.scheduler.waiting):
            time.sleep(0.0005)  # streams wait for room (blocks, a slot): let the sender free some
        self._unposted = cancelled + self.advance(running)
        # Streams that arrived while the step ran start before its outputs are posted (the
        # next pass): posting may wait for a sender, and their first outputs need not.
        if self._unposted and not self._inbox:
            self._post(self._take_unposted())

    def _take_unposted(self) -> List[Emission]:
        """What a step made and the loop has not posted yet, taken (each emission is posted once)."""
        unposted, self._unposted = self._unposted, []
        return unposted

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
                except Exception as exc:  # an output Triton cannot carry ends its stream with that error
                    outcome = ModelError(f"model {self.engine.name!r}: could not make a response of its output: "
                                         f"{failure_text(exc)}")
                    if not final:
                        self.engine.drop(stream)
                        final = True
            ready.append((stream, outcome, final))
        return ready

    def _ended(self, error: Exception) -> List[Emission]:
        """Every stream still running or waiting ends with `error` (the model is unloading, or
        the loop failed)."""
        emissions = []
        for stream in [*self.engine.live, *self.scheduler.drain(), *self._inbox]:
            self.engine.drop(stream)
            emissions.append((stream, error, True))
        self._inbox.clear()
        self._count(emissions)
        self.held = self.engine.held()
        return emissions

    def close(self, timeout: float = 5.0) -> None:
        with self._wake:
            self._closing = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)
