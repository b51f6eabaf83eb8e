"""Runs the requests of one `execute` call: sessions, batching, priorities, deadlines,
model calls, splitting, and isolation of failures."""

from __future__ import annotations

import collections
import time
from typing import Callable, Deque, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from latte.backend.batching import Batch, affinity_key, assemble, assemble_columns, ragged_length, split, uniform_shapes
from latte.backend.config import ModelSpec
from latte.backend.errors import DeadlineExceeded, ModelError, OutOfMemory, RequestError
from latte.backend.options import DEFAULT_OPTIONS, RequestOptions
from latte.backend.planner import BatchPlanner
from latte.backend.requests import Columns, ParsedRequest
from latte.backend.runtimes import Runtime
from latte.backend.sessions import SessionStore

Result = Union[Dict[str, np.ndarray], Exception]


def failure_text(exc: BaseException) -> str:
    """'Type: the line that says what went wrong' (a TorchScript error opens with a generic line
    and a traceback and ends with the exception raised inside the model)."""
    text = str(exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    traceback_like = len(lines) > 1 and ("Traceback" in text or "TorchScript" in lines[0])
    first = (lines[-1] if traceback_like else lines[0]) if lines else ""
    if len(first) > 300:
        first = first[:297] + "..."
    return type(exc).__name__ + (f": {first}" if first else "")


def _drained(records: Deque[tuple]) -> List[tuple]:
    """Every record in the deque now, taken out; safe while other threads append or take."""
    taken = []
    try:
        while True:
            taken.append(records.popleft())
    except IndexError:
        return taken


def column_request(columns: Columns, i: int) -> ParsedRequest:
    """Request i of a call read by input, as the general path reads it."""
    length = columns.lengths[i] if columns.lengths is not None else None
    return ParsedRequest({name: arrays[i] for name, arrays in columns.arrays.items()}, columns.rows[i], length=length)


def model_failure(model: str, exc: BaseException) -> ModelError:
    """The client's one line for an exception raised by the model: its type and the line that
    says what went wrong. A step of a graph that failed is worded already, with the step."""
    if isinstance(exc, ModelError):
        return ModelError(f"model {model!r}: {exc}", detail=exc.detail)
    return ModelError(f"model {model!r} failed: {failure_text(exc)}", detail=f"{type(exc).__name__}: {str(exc).strip()}")


class BatchRecord(NamedTuple):
    """What one model call did, for metrics; the runner appends it as a plain tuple (a call
    on the request path costs more than the record) and take_records names its fields."""
    rows: int
    requests: int
    padded_length: Optional[int]
    seconds: float                # the whole batch: packing, the model call, splitting
    failed: bool
    model_seconds: float = 0.0    # inside the model runtime alone


class Work:
    """One request on its way through the engine: where its answer goes (`position`), its
    inputs, options, and when it arrived; one is made per request, hence the slots."""

    __slots__ = ("position", "request", "options", "arrival", "deadline")

    def __init__(self, position: int, request: ParsedRequest, options: RequestOptions = DEFAULT_OPTIONS,
                 arrival: float = 0.0) -> None:
        self.position = position
        self.request = request
        self.options = options
        self.arrival = arrival
        self.deadline = _NEVER if options.timeout_ms is None else arrival + options.timeout_ms / 1000.0

    def at(self, position: int) -> "Work":
        """The same work answered at another position."""
        return Work(position, self.request, self.options, self.arrival)


_NEVER = float("inf")


# Records a caller has not taken are dropped past this many (the oldest first), so an engine
# whose caller never takes them (a tool's, a benchmark's) cannot grow without bound.
_MAX_RECORDS = 1 << 16


class BatchEngine:
    def __init__(self, spec: ModelSpec, runtime: Runtime, planner: Optional[BatchPlanner] = None,
                 sessions: Optional[SessionStore] = None, session_input: Optional[str] = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.spec = spec
        self.runtime = runtime
        self.planner = planner or BatchPlanner(spec)
        self.sessions = sessions
        self.session_input = session_input
        self.clock = clock
        # What each batch run did, for the caller to take (take_records): the engine records,
        # it calls nothing back. Lanes append from their threads; a deque takes that.
        self.records: Deque[tuple] = collections.deque(maxlen=_MAX_RECORDS)
        self.recording = True  # off while the cost model is timed: timing calls are not traffic
        self.dispatcher = None  # a LaneDispatcher runs batches on scheduler lanes when set
        self._out_dtypes = {t.name: t.dtype for t in spec.signature.outputs}
        self._batched = spec.signature.batched
        self._one_shape = (spec.signature.batched and not spec.signature.ragged_inputs and uniform_shapes(spec)
                           and not runtime.trims_outputs)
        # Every request has one shape key (ragged inputs of one rank): a plain call is planned
        # from its lengths alone (BatchPlanner.plan).
        self._one_key = spec.signature.batched and spec.signature.ragged_inputs and uniform_shapes(spec)

    @property
    def reads_columns(self) -> bool:
        """Whether a plain call may be read by input and run by the planner and run_columns:
        every request of one shape key (one shape, or ragged inputs of one rank), batches run
        inline."""
        return (self._one_shape or self._one_key) and self.dispatcher is None

    # -- the whole call -------------------------------------------------------------------
    def answers(self, items: Sequence[Union[ParsedRequest, Exception]],
                options: Optional[Sequence[Optional[RequestOptions]]] = None) -> Iterator[List[Tuple[int, Result]]]:
        """The call's results a group at a time, as they become known: the unreadable requests
        first, then the requests of each batch as it finishes, so the caller can answer early
        requests before later batches run. Every item appears exactly once, as
        (position, outputs or the exception that explains the failure)."""
        if options is None and self.dispatcher is None:
            # Default options throughout: no session, no deadline, one priority, so the plan's
            # batches run as planned, with no work to order; the whole call is a plan of one batch.
            readable = [(i, item) for i, item in enumerate(items) if type(item) is ParsedRequest]
            if len(readable) < len(items):
                yield [(i, item) for i, item in enumerate(items) if type(item) is not ParsedRequest]
            for group in self._plan(readable):
                yield list(zip([position for position, _ in group], self._run_requests([r for _, r in group])))
            return
        now = self.clock()
        work, refused = self._admit(items, options, now)
        if refused:
            yield refused
        if not work:
            return
        if self.dispatcher is not None:
            yield from self.dispatcher.run(work, now)
        else:
            for group in self.order(self._groups(work)):
                yield self._run_in_time(group)

    def columns_batch(self, columns: Dict[str, List[np.ndarray]], rows: Sequence[int],
                      lengths: Optional[Sequence[int]], members: Optional[Sequence[int]] = None) -> Batch:
        """The batch of a plain call read by input (all its requests, or those at `members`):
        each input packed natively, ragged ones padded."""
        if members is not None:
            columns = {name: [arrays[i] for i in members] for name, arrays in columns.items()}
            rows = [rows[i] for i in members]
            lengths = [lengths[i] for i in members] if lengths is not None else None
        return assemble_columns(self.spec, columns, rows, lengths, self.planner.buckets)

    def run_columns(self, columns: Columns, plan: Sequence[Sequence[int]]) -> List[Result]:
        """Each request's outcome, in order, for a plain call read by input and planned by
        the planner: each batch packed natively, run and cut back into views. A batch that
        fails is isolated as on the general path (its requests alone); the others are not run
        again."""
        results: List[Result] = [None] * len(columns.rows)  # type: ignore[list-item]
        for members in plan:
            for i, outcome in zip(members, self._run_members(columns, members)):
                results[i] = outcome
        return results

    def run_whole(self, columns: Columns) -> Tuple[Optional[Dict[str, np.ndarray]], Optional[List[Result]]]:
        """A plain call that is one batch: (its outputs, None), or when the batch fails
        (None, each request's outcome, run alone)."""
        started = self.clock()
        batch = None
        try:
            batch = assemble_columns(self.spec, columns.arrays, columns.rows, columns.lengths, self.planner.buckets)
            return self.run(batch, started)[0], None
        except Exception as exc:
            return None, self._isolated(exc, batch, started, len(columns.rows),
                                        lambda: [column_request(columns, i) for i in range(len(columns.rows))])
        finally:
            del batch  # arena-backed input buffers go back as soon as the call is over

    def _run_members(self, columns: Columns, members: Sequence[int]) -> List[Result]:
        started = self.clock()
        batch = ran = None
        try:
            batch = self.columns_batch(columns.arrays, columns.rows, columns.lengths, members)
            ran = self.run(batch, started)
            return split(self.spec, batch, *ran)
        except Exception as exc:  # a batch recorded as run is not recorded again as failed
            return self._isolated(exc, batch if ran is None else None, started, len(members),
                                  lambda: [column_request(columns, i) for i in members])
        finally:
            del batch

    def infer(self, items: Sequence[Union[ParsedRequest, Exception]],
              options: Optional[Sequence[Optional[RequestOptions]]] = None) -> List[Result]:
        """One result per item, in order (`answers`, collected)."""
        results: List[Result] = [None] * len(items)
        for outcomes in self.answers(items, options):
            for position, outcome in outcomes:
                results[position] = outcome
        return results

    def submit(self, items: Sequence[Union[ParsedRequest, Exception]],
               options: Sequence[Optional[RequestOptions]],
               on_results: Callable[[List[Tuple[int, Result]]], None]) -> None:
        """Hand the requests to the scheduler's lanes and return at once; `on_results` hears
        every request exactly once: refusals here, the rest from the lane that ran them."""
        if self.dispatcher is None:
            raise RuntimeError("submit needs scheduler lanes (a LaneDispatcher)")
        now = self.clock()
        work, refused = self._admit(items, options, now)
        if refused:
            on_results(refused)
        if work:
            self.dispatcher.submit(work, now, on_results)

    def _admit(self, items, options, now: float) -> Tuple[List[Work], List[Tuple[int, Result]]]:
        """Work for the readable requests (their sessions continued), and the refusals."""
        work: List[Work] = []
        refused: List[Tuple[int, Result]] = []
        for i, item in enumerate(items):
            if isinstance(item, Exception):
                refused.append((i, item))
                continue
            opts = (options[i] if options is not None else None) or DEFAULT_OPTIONS
            if opts.session_id is not None:
                try:
                    item = self._with_session(item, opts)
                except RequestError as exc:
                    refused.append((i, exc))
                    continue
            work.append(Work(i, item, opts, now))
        return work, refused

    def _groups(self, work: Sequence[Work]) -> List[List[Work]]:
        by_position = {w.position: w for w in work}
        return [[by_position[pos] for pos, _ in group] for group in self._plan([(w.position, w.request) for w in work])]

    def _plan(self, pairs: Sequence[Tuple[int, ParsedRequest]]) -> List[List[Tuple[int, ParsedRequest]]]:
        """(position, request) pairs in batches, as the planner plans them."""
        return self.planner.plan_requests(pairs)

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
        """Run the requests as one model call, as a plan would (no ordering, no deadlines):
        what the cost model's timings measure."""
        return self._run_requests(requests)

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
        results = self._run_requests([w.request for w in group])
        if self.sessions is not None:
            for w, result in zip(group, results):
                if not isinstance(result, Exception):
                    self._commit_session(w)
        return [(w.position, result) for w, result in zip(group, results)]

    def _run_requests(self, requests: Sequence[ParsedRequest]) -> List[Result]:
        """One model call for the requests, a result for each in order; a model failure is
        retried request by request so one bad request does not fail its neighbours."""
        started = self.clock()
        batch = ran = None
        try:
            batch = assemble(self.spec, requests, self.planner.buckets)
            ran = self.run(batch, started)
            return split(self.spec, batch, *ran)
        except Exception as exc:  # a batch recorded as run is not recorded again as failed
            return self._isolated(exc, batch if ran is None else None, started, len(requests), lambda: requests)
        finally:
            del batch  # arena-backed input buffers go back as soon as the call is over

    def _isolated(self, exc: Exception, batch: Optional[Batch], started: float, count: int,
                  requests: Callable[[], Sequence[ParsedRequest]]) -> List[Result]:
        """The outcomes of a batch of `count` requests that raised `exc`: a full arena fails
        them all (not the model's fault, nor the requests'); otherwise the batch is recorded as
        failed and each request runs alone, so only those the model fails on fail."""
        if isinstance(exc, MemoryError):
            return [exc if isinstance(exc, OutOfMemory) else OutOfMemory(str(exc))] * count
        if batch is not None:
            self._record_failed(batch, count, started)
        if count == 1:
            # A step of a graph that refuses what this request brought answers it as a bad request.
            return [exc if isinstance(exc, RequestError) else model_failure(self.spec.signature.name, exc)]
        return [result for request in requests() for result in self._run_requests([request])]

    def run(self, batch: Batch, started: Optional[float] = None
            ) -> Tuple[Dict[str, np.ndarray], Optional[Dict[str, List[int]]]]:
        """The one batch runner: the batch through the model (the one place a batch meets its
        runtime, or the graph of steps it runs), its outputs checked to hold its rows, and
        recorded. Gives the outputs and each request's own length of ragged ones where the
        runtime says them (Runtime.run_batch). Raises when the model fails; callers isolate
        what failed."""
        called = self.clock()
        outputs, lengths = self.runtime.run_batch(batch)
        ran = self.clock()
        total = batch.rows if self._batched else None
        for name, array in outputs.items():
            dtype = self._out_dtypes.get(name)
            if dtype is not None and (type(array) is not np.ndarray or array.dtype != dtype):
                # A framework's tensor, or another type than declared: numpy of the declared one.
                array = outputs[name] = np.asarray(array, dtype=dtype)
            if total is not None and (array.ndim == 0 or array.shape[0] != total):
                raise RuntimeError(f"output {name!r} has shape {list(array.shape)}; expected {total} rows "
                                   "for this batch")
        if self.recording:
            self.records.append((batch.rows, len(batch.member_rows), batch.padded_length,
                                 ran - (called if started is None else started), False, ran - called))
        return outputs, lengths

    def _record_failed(self, batch: Batch, requests: int, started: float) -> None:
        if self.recording:
            self.records.append((batch.rows, requests, batch.padded_length, self.clock() - started, True, 0.0))

    def take_records(self) -> List[BatchRecord]:
        """The records of the batches run since the last take, oldest first."""
        return [BatchRecord(*record) for record in _drained(self.records)]

    # -- sessions -------------------------------------------------------------------------
    def _with_session(self, request: ParsedRequest, opts: RequestOptions) -> ParsedRequest:
        if opts.session_id is None:
            return request
        if self.sessions is None or self.session_input is None:
            raise RequestError(f"model {self.spec.signature.name!r} keeps no session state; drop session_id "
                               f"(or set the parameter session_input in its config)")
        tokens = request.inputs[self.session_input]
        sequence = self.sessions.extend(opts.session_id, tokens, opts.session_start)
        return ParsedRequest(inputs={**request.inputs, self.session_input: sequence}, rows=1,
                             parameters=request.parameters)

    def _commit_session(self, w: Work) -> None:
        if w.options.session_id is not None and self.sessions is not None:
            self.sessions.commit(w.options.session_id, w.request.inputs[self.session_input], w.options.session_end)
