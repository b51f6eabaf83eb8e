"""Runs the requests of one `execute` call: sessions, batching, priorities, deadlines,
model calls, splitting, and isolation of failures."""

from __future__ import annotations

import time
from typing import Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from latte.backend.batch_runner import BatchRunner, isolated, out_of_memory, request_failure
from latte.backend.batching import Batch, affinity_key, assemble, assemble_columns, ragged_length, row_views, split
from latte.backend.config import ModelSpec
from latte.backend.errors import DeadlineExceeded, RequestError
from latte.backend.options import DEFAULT_OPTIONS, RequestOptions
from latte.backend.planner import BatchPlanner
from latte.backend.requests import Call, ParsedRequest, requests_call
from latte.backend.sessions import SessionStore, Turn

Result = Union[Dict[str, np.ndarray], Exception]


class BatchAnswer(NamedTuple):
    """The answers of one planned batch: the `positions` of its requests in the call and each
    one's outcome; or, when the batch ran and each request's answer is its rows of the
    outputs as they are, `results` None and the batch's `outputs` with each request's
    `member_rows` (a batch is answered with views of itself). `turns`: the session turns of
    the requests answered with outputs, by position, which whoever builds their responses
    settles (`settle`): a session advances only once its answer is built."""
    positions: Sequence[int]
    results: Optional[List[Result]]
    outputs: Optional[Dict[str, np.ndarray]] = None
    member_rows: Optional[List[int]] = None
    turns: Optional[Dict[int, Turn]] = None

    def outcomes(self) -> List[Result]:
        """Each request's outcome, in the order of `positions`."""
        return self.results if self.results is not None else row_views(self.outputs, self.member_rows)


# A NamedTuple's constructor is a Python call: the batch runner makes its answers with
# tuple.__new__ (a C call), and the request path reads them by unpacking.
_new_tuple = tuple.__new__


def answered(pairs: Sequence[Tuple[int, Result]], turns: Optional[Dict[int, Turn]] = None) -> BatchAnswer:
    """The answer of (position, outcome) pairs."""
    return BatchAnswer([position for position, _ in pairs], [outcome for _, outcome in pairs], None, None, turns)


class Work:
    """One request on its way through the engine: where its answer goes (`position`), its
    inputs, options, and when it arrived; one is made per request, hence the slots."""

    __slots__ = ("position", "request", "options", "arrival", "deadline", "turn")

    def __init__(self, position: int, request: ParsedRequest, options: RequestOptions = DEFAULT_OPTIONS,
                 arrival: float = 0.0, turn: Optional[Turn] = None) -> None:
        self.position = position
        self.request = request
        self.options = options
        self.arrival = arrival
        self.deadline = _NEVER if options.timeout_ms is None else arrival + options.timeout_ms / 1000.0
        self.turn = turn  # the session's turn this request is, settled by its answer

    def at(self, position: int) -> "Work":
        """The same work answered at another position."""
        return Work(position, self.request, self.options, self.arrival, self.turn)


_NEVER = float("inf")


def _failed_with(request: ParsedRequest, failure: Exception) -> Result:
    return failure


class BatchEngine:
    """Runs calls on a model's graph of steps (graph.Graph: a plain model is a graph of one
    model step), planned by the model's one planner: the graph's own for a graph of one model
    step, else one of the model's spec."""

    def __init__(self, spec: ModelSpec, graph, planner: Optional[BatchPlanner] = None,
                 sessions: Optional[SessionStore] = None, session_input: Optional[str] = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.spec = spec
        self.planner = planner or graph.planner or BatchPlanner(spec)
        self.sessions = sessions
        self.session_input = session_input
        self.clock = clock
        # Runs every batch and records what each did, for the caller to take (runner.take_records).
        self.runner = BatchRunner(graph, clock)
        self.dispatcher = None  # a LaneDispatcher runs batches on scheduler lanes when set
        # Whether a batch's answers are views of its rows: batched, and no output declared to be
        # cut back to each request's length; a batch whose runtime says its rows' own lengths of a
        # ragged output is cut back by split instead.
        self._views = spec.signature.batched and not spec.signature.trimmed_outputs

    # -- the whole call -------------------------------------------------------------------
    def answers(self, call: Call) -> Iterable[BatchAnswer]:
        """plan -> run: the call's answers a batch at a time, as each batch finishes, the
        refused requests first, so the caller can answer early requests before later batches
        run. Every request appears exactly once.

        The reader's layout decides what is left to do, not the way through: a call read by
        input is every request plain and readable, so its batches run as the planner planned
        them (a plan of one batch at once: nothing to wait for); a call read request by
        request has its refusals answered, its sessions continued, and the same planner's
        batches ordered by priority and deadline, run inline or on the lanes."""
        if call.items is None:
            plan = self.planner.plan(call.rows, call.lengths)
            if len(plan) == 1:
                return (self._run_members(call, plan[0]),)
            return self._planned(call, plan)
        return self._ordered(call)

    def _planned(self, call: Call, plan: List[Sequence[int]]) -> Iterator[BatchAnswer]:
        # A generator of its own: one written inside `answers` would make `answers` keep its
        # locals in cells, a cost every call pays.
        for members in plan:
            yield self._run_members(call, members)

    def _ordered(self, call: Call) -> Iterator[BatchAnswer]:
        now = self.clock()
        work, refused = self._admit(call.items, call.options, now)
        turns = self._turns(work)
        try:
            if refused:
                yield answered(refused)
            if not work:
                return
            if self.dispatcher is not None:
                groups = self.dispatcher.run(work, now)
            else:
                groups = (self._run_in_time(group) for group in self.order(self._groups(work)))
            for pairs in groups:
                yield answered(pairs, self._hand_over(turns, pairs))
        finally:
            self._release(turns)  # turns never handed over: the call failed or was abandoned

    def infer(self, items: Sequence[Union[ParsedRequest, Exception]],
              options: Optional[Sequence[Optional[RequestOptions]]] = None) -> List[Result]:
        """One result per item, in order (`answers`, collected)."""
        results: List[Result] = [None] * len(items)
        for answer in self.answers(requests_call(items, options)):
            for position, outcome in zip(answer.positions, answer.outcomes()):
                results[position] = outcome
            if answer.turns:
                self.settle(answer.turns, answer.turns)  # answered as they are: each turn with outputs
        return results

    def submit(self, items: Sequence[Union[ParsedRequest, Exception]],
               options: Sequence[Optional[RequestOptions]],
               on_results: Callable[[List[Tuple[int, Result]], Optional[Dict[int, Turn]]], None]) -> None:
        """Hand the requests to the scheduler's lanes and return at once; `on_results` hears
        every request exactly once, with the session turns of those answered with outputs
        (to settle once their responses are built): refusals here, the rest from the lane
        that ran them."""
        if self.dispatcher is None:
            raise RuntimeError("submit needs scheduler lanes (a LaneDispatcher)")
        now = self.clock()
        work, refused = self._admit(items, options, now)
        turns = self._turns(work)

        def results(pairs: List[Tuple[int, Result]]) -> None:
            on_results(pairs, self._hand_over(turns, pairs))
        try:
            if refused:
                on_results(refused, None)
            if work:
                # It answers through the callback whatever it queued, or could not queue.
                self.dispatcher.submit(work, now, results)
        except BaseException:
            self._release(turns)  # nothing of this call was queued
            raise

    def _admit(self, items, options, now: float) -> Tuple[List[Work], List[Tuple[int, Result]]]:
        """Work for the readable requests (their sessions continued), and the refusals."""
        work: List[Work] = []
        refused: List[Tuple[int, Result]] = []
        for i, item in enumerate(items):
            if isinstance(item, Exception):
                refused.append((i, item))
                continue
            opts = (options[i] if options is not None else None) or DEFAULT_OPTIONS
            turn = None
            if opts.session_id is not None:
                try:
                    item, turn = self._with_session(item, opts)
                except Exception as exc:  # this request's session alone: a full arena, a bad turn
                    refused.append((i, request_failure(self.spec.signature.name, exc)))
                    continue
            work.append(Work(i, item, opts, now, turn))
        return work, refused

    def _groups(self, work: Sequence[Work]) -> List[List[Work]]:
        by_position = {w.position: w for w in work}
        return [[by_position[pos] for pos, _ in group]
                for group in self.planner.plan_requests([(w.position, w.request) for w in work])]

    def planned_keys(self, work: Sequence[Work]) -> Dict[int, tuple]:
        """Each request's affinity key under this call's plan: the bucket edge of the batch it
        was planned into, so the scheduler groups (and places) whole planned batches."""
        keys = {}
        for group in self._groups(work):
            lengths = [n for n in (ragged_length(self.spec, w.request) for w in group) if n is not None]
            edge = self.planner.edge(max(lengths, default=None))
            for w in group:
                keys[w.position] = affinity_key(self.spec, w.request, self.planner.buckets, edge)
        return keys

    @staticmethod
    def order(groups: List[List[Work]]) -> List[List[Work]]:
        """Higher priority first, then the earliest deadline."""
        if len(groups) < 2:
            return groups
        return sorted(groups, key=lambda g: (-max(w.options.priority for w in g), min(w.deadline for w in g)))

    # -- one batch ------------------------------------------------------------------------
    def run_group(self, group: Sequence[Work]) -> List[Tuple[int, Result]]:
        """Run work of one affinity key as handed over by the scheduler. Its key is the batch
        the call's plan put it in, and the scheduler keeps a batch within max_batch_size
        rows, so the group runs as it is; only a group past that limit is planned again."""
        if not self.planner.fits(sum(w.request.rows for w in group)):
            return [outcome for batch in self._groups(group) for outcome in self._run_in_time(batch)]
        return self._run_in_time(group)

    def run_batch(self, requests: Sequence[ParsedRequest]) -> List[Result]:
        """Run the requests as one model call, as a plan would (no ordering, no deadlines), a
        result for each in order: what the cost model's timings measure."""
        return self._run_members(requests_call(requests), range(len(requests))).outcomes()

    def _run_in_time(self, group: Sequence[Work]) -> List[Tuple[int, Result]]:
        """Run one planned batch, failing the requests whose deadline has already passed;
        a model failure is retried request by request so one bad request does not fail its
        neighbours."""
        now = self.clock()
        outcomes: List[Tuple[int, Result]] = []
        live = []
        for w in group:
            if now > w.deadline:
                waited = (now - w.arrival) * 1000
                outcomes.append((w.position, DeadlineExceeded(
                    f"timed out: waited {waited:.1f} ms, longer than timeout_ms={w.options.timeout_ms:g}")))
            else:
                live.append(w)
        if live:
            outcomes.extend(self._run(live))
        return outcomes

    def _run(self, group: Sequence[Work]) -> List[Tuple[int, Result]]:
        results = self.run_batch([w.request for w in group])
        return [(w.position, result) for w, result in zip(group, results)]

    def _run_members(self, call: Call, members: Sequence[int]) -> BatchAnswer:
        """The requests of the call at `members` as one planned batch, packed as the reader
        built them (by input, or request by request) and run by the one batch runner; a
        model failure is retried request by request so one bad request does not fail its
        neighbours."""
        started = self.clock()
        batch = ran = None
        try:
            if call.items is not None:
                batch = assemble(self.spec, [call.items[i] for i in members], self.planner.buckets)
            elif type(members) is range:  # the whole call, in order (the planner's one batch)
                batch = assemble_columns(self.spec, call.arrays, call.rows, call.lengths, self.planner.buckets)
            else:
                batch = self._columns_batch(call, members)
            outputs, own = ran = self.runner.run(batch, started)
            if own is None and self._views:
                return _new_tuple(BatchAnswer, (members, None, outputs, batch.member_rows, None))
            return BatchAnswer(members, split(self.spec, batch, outputs, own))
        except Exception as exc:
            # One recorded as run is not again; a full arena is no failure of the model's.
            if batch is not None and ran is None and out_of_memory(self.spec.signature.name, exc) is None:
                self.runner.record_failed(batch, len(members), started)
            # The failed batch's arena buffers go back before its requests run alone, its own
            # and those the exception's frames hold: on a tight arena the retries need them.
            batch = ran = outputs = own = None
            exc.__traceback__ = None
            return BatchAnswer(members, isolated(self.spec.signature.name, exc, call.requests(members),
                                                 self._alone, _failed_with))
        finally:
            del batch  # arena-backed input buffers go back as soon as the call is over

    def _alone(self, request: ParsedRequest) -> List[Result]:
        return self.run_batch([request])

    def _columns_batch(self, call: Call, members: Sequence[int]) -> Batch:
        """The batch of the requests at `members` of a call read by input: each input packed
        natively, ragged ones padded."""
        arrays = {name: [column[i] for i in members] for name, column in call.arrays.items()}
        rows = [call.rows[i] for i in members]
        lengths = [call.lengths[i] for i in members] if call.lengths is not None else None
        return assemble_columns(self.spec, arrays, rows, lengths, self.planner.buckets)

    # -- sessions -------------------------------------------------------------------------
    def _with_session(self, request: ParsedRequest, opts: RequestOptions) -> Tuple[ParsedRequest, Turn]:
        if self.sessions is None or self.session_input is None:
            raise RequestError(f"model {self.spec.signature.name!r} keeps no session state; drop session_id "
                               f"(or set the parameter session_input in its config)")
        tokens = request.inputs.get(self.session_input)
        if tokens is None:
            raise RequestError(f"a session request carries the session's tokens in input {self.session_input!r}, "
                               "which this request does not")
        turn = self.sessions.extend(opts.session_id, tokens, opts.session_start, opts.session_end)
        return ParsedRequest(inputs={**request.inputs, self.session_input: turn.sequence}, rows=1,
                             parameters=request.parameters), turn

    @staticmethod
    def _turns(work: Sequence[Work]) -> Dict[int, Turn]:
        """The session turns among `work`, by position: each is settled by its request's answer."""
        return {w.position: w.turn for w in work if w.turn is not None}

    def _hand_over(self, turns: Dict[int, Turn], pairs: Sequence[Tuple[int, Result]]) -> Optional[Dict[int, Turn]]:
        """The turns of answered requests leave `turns`: those answered with an error are
        released here; those answered with outputs are handed to whoever builds the responses,
        who settles them once built (not before, so an answer that cannot be built advances no
        session; not after it is sent, so the session's next request finds this one's prefix)."""
        if not turns:
            return None
        handed = {}
        for position, outcome in pairs:
            turn = turns.pop(position, None)
            if turn is None:
                continue
            if isinstance(outcome, Exception):
                self.sessions.release(turn)
            else:
                handed[position] = turn
        return handed or None

    def settle(self, turns: Dict[int, Turn], answered: Iterable[int]) -> None:
        """Settle turns handed over with an answer: those at the positions `answered` (their
        responses built with outputs) committed, the rest released."""
        answered = set(answered)
        for position, turn in turns.items():
            if position in answered:
                self.sessions.commit(turn)
            else:
                self.sessions.release(turn)

    def _release(self, turns: Dict[int, Turn]) -> None:
        for position in list(turns):
            turn = turns.pop(position, None)  # a lane may settle it meanwhile
            if turn is not None:
                self.sessions.release(turn)
