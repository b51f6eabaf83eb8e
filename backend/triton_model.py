"""What `model.py` delegates to: load once, then turn requests into responses."""

from __future__ import annotations

import gc
import itertools
import os
import queue
import threading
import time
import warnings
from typing import List, Optional, Tuple

import numpy as np

from latte.backend import autocomplete, device_memory, memory_resource, vitals
from latte.backend.config import (ARENA_PAGE_BYTES, parse_args, parse_model_config, thread_budget_warning,
                                  usable_core_ids)
from latte.backend.batch_runner import model_failure
from latte.backend.engine import BatchEngine
from latte.backend.errors import ModelError
from latte.backend.lanes import LaneDispatcher
from latte.backend.metrics import BackendMetrics, TritonPublisher, outcome_label
from latte.backend.graph.graph import load_model
from latte.backend.requests import RequestError, RequestReader
from latte.backend.responses import EarlyAnswers, ResponseBuilder
from latte.backend.sessions import SessionStore
from latte.backend.warmup import measure_cost_model, warmup_calls
from latte.bench.procmem import rss_bytes
from latte.memory import BuddyArena


_SENT = object()        # a response already sent through its response sender
_LAST = float("inf")    # the outbox key that sorts after every priority
_SUCCESS = ("success", 0)  # the tally key of a request answered with outputs at default priority


def _top_priority(positions, options) -> int:
    if options is None:
        return 0
    return max((options[p].priority if options[p] is not None else 0) for p in positions)


def _lowest_waiting(responses, options) -> int:
    """The lowest priority among the call's requests still to run."""
    if options is None:
        return 0
    return min((o.priority if o is not None else 0) for o, r in zip(options, responses) if r is None)


def lane_cpus(spec) -> Optional[List[List[int]]]:
    """CPU sets for pinned lanes (parameter pin_lanes), intra_op_threads cores each.

    Unpinned by default: several models in one server would otherwise all pin their first
    lane to the same core.
    """
    if not spec.serving.pin_lanes:
        return None
    cores = sorted(usable_core_ids())
    per = spec.serving.intra_op_threads
    return [cores[i * per:(i + 1) * per] for i in range(spec.serving.lanes)]


def stop_parts(pb, model: str, parts) -> None:
    """Stop what a model started, (part, stop or None) the last started first; a part that
    fails to stop is logged and the others still stop (after a failed load, its error stays
    the one told)."""
    for part, stop in parts:
        if stop:
            try:
                stop()
            except Exception as exc:
                pb.Logger.log_error(f"latte: {model}: stopping the {part} failed: {type(exc).__name__}: {exc}")


def instance_device(args) -> str:
    if str(args.get("model_instance_kind", "CPU")).upper() == "GPU":
        return f"cuda:{int(args.get('model_instance_device_id', 0))}"
    return "cpu"


def host_arena(pb, spec) -> BuddyArena:
    """The instance's host arena, made the current resource: batch buffers, a graph's
    intermediates, session and stream state live there, so memory stays flat however shapes
    vary. Where pages cannot be had, the server log says why (a warning when the config asked)."""
    serving = spec.serving
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        arena = BuddyArena(serving.arena_bytes, "cpu", paged=serving.arena_pages, page_bytes=ARENA_PAGE_BYTES)
    if arena.fallback_reason:
        log = pb.Logger.log_warn if serving.arena_pages_asked else pb.Logger.log_info
        log(f"latte: {spec.signature.name}: arena_pages: the plain buddy arena serves: {arena.fallback_reason}")
    memory_resource.use(arena.empty)
    return arena


class LatteModel:
    def __init__(self, args, pb) -> None:
        self.pb = pb
        config, model_dir, version = parse_args(args)
        self.spec = spec = parse_model_config(config, model_dir, version, device=instance_device(args))
        self._async = spec.serving.async_execute  # asked on every call
        oversubscribed = thread_budget_warning(spec)
        if oversubscribed is not None:
            pb.Logger.log_warn(f"latte: {oversubscribed}")
        self.arena = host_arena(pb, spec)
        device_memory.use(spec.serving)  # before the model's first CUDA tensor
        self.graph = self.dispatcher = self.publisher = self._sender = self.vitals = None
        self._serving = False  # set once loaded: warm-up's batches are not served ones
        try:
            # Where `latte serve` supervises the model: what it runs is marked, what crashed it refused.
            self.vitals = vitals.for_instance(args, spec, pb.Logger)
            self._load(args)
        except BaseException:
            self._close()  # what loaded goes; the load's own error is the one raised
            raise

    def _load(self, args) -> None:
        spec, pb = self.spec, self.pb
        signature, serving = spec.signature, spec.serving
        self.graph, accuracy = load_model(spec)  # a plain model is a graph of one model step
        if accuracy is not None:
            pb.Logger.log_info(f"latte: {signature.name}: {accuracy.text()}")
        self.sessions = self._sessions()
        self.metrics = BackendMetrics()
        self.metrics.thread_budget(serving.thread_budget.state, serving.thread_budget.threads)
        self.engine = BatchEngine(spec, self.graph, sessions=self.sessions, session_input=serving.session_input)
        if serving.scheduler == "affinity":
            window = serving.batch_window_us / 1e6 if serving.async_execute else 0.0
            self.dispatcher = self.engine.dispatcher = LaneDispatcher(self.engine, serving.lanes, lane_cpus(spec),
                                                                      queue_capacity=serving.max_queue_size,
                                                                      max_window_s=window)
        # A plain call of a model whose requests share one shape key is read by input, its
        # batches run inline; any other call is read request by request.
        self.reader = RequestReader(spec, by_columns=self.engine.planner.one_shape_key and self.dispatcher is None,
                                    check_cancellation=serving.check_cancellation)
        self.responses = ResponseBuilder(pb, [t.name for t in signature.outputs])
        self.early = EarlyAnswers(serving.respond)
        # Answers of async_execute wait here for the sender thread, highest priority_level first
        # (then in the order they finished): (-priority, sequence number, [(sender, response)],
        # the call's Landing or None).
        self._outbox: "queue.PriorityQueue" = queue.PriorityQueue()
        self._sequence = itertools.count()
        if serving.async_execute:
            self._sender = threading.Thread(target=self._send_responses, name=f"latte-responses-{signature.name}",
                                            daemon=True)
            self._sender.start()
        # Publishing is off the request path: each Triton metric update is a round trip to the server.
        self.publisher = TritonPublisher(pb, self.metrics.aggregate, signature.name, refresh=self._refresh_gauges,
                                         instance=args.get("model_instance_name", ""))
        self._ready(self._warmup() if serving.warmup else 0)

    def _sessions(self) -> Optional[SessionStore]:
        serving, name = self.spec.serving, self.spec.signature.name
        if not serving.session_input:
            return None
        if serving.instance_count > 1:
            self.pb.Logger.log_warn(
                f"latte: {name}: sessions live in the instance that opened them and Triton hands each "
                f"request to any of the {serving.instance_count} instances, so a session's next request can be "
                "refused as unknown; serve a model with session_input on one instance")
        if self.vitals is None:
            return SessionStore(serving.session_ttl_s, serving.max_sessions, serving.max_sequence_length)
        kept = self.vitals.checkpoint()
        store = SessionStore(serving.session_ttl_s, serving.max_sessions, serving.max_sequence_length,
                             checkpoint=kept)
        restored = store.restore(kept.load())
        if restored:
            self.pb.Logger.log_info(f"latte: {name}: {restored} session(s) resumed where the last process left them")
        return store

    def _ready(self, warmed: int) -> None:
        """The cost model measured, the collector told to leave what loaded alone, and the
        ready line logged."""
        signature, serving = self.spec.signature, self.spec.serving
        self.engine.runner.take_records()  # load's own batches are not served ones
        self._serving = True
        if serving.warmup and self.engine.planner.cost_model is not None:
            measured = measure_cost_model(self.engine)
            if measured is not None:
                self.engine.planner.cost_model = measured
        planning = serving.batch_planning
        if self.engine.planner.cost_model is not None:
            planning += f" ({'measured' if serving.warmup else 'default'}: {self.engine.planner.cost_model.describe()})"
        # Everything loaded so far (runtime, modules, warmup) lives as long as the model: out of
        # the collector's sight, a full collection no longer walks it (~15 ms pauses in the
        # request path, measured in process with onnxruntime loaded).
        gc.freeze()
        described = self.graph.describe()
        steps = f", {described}" if described else ""
        self.pb.Logger.log_info(
            f"latte: {signature.name} ready ({signature.runtime}, {signature.model_path.name}{steps}, "
            f"max_batch_size={signature.max_batch_size}, intra_op_threads={serving.intra_op_threads}, "
            f"scheduler={serving.scheduler}, lanes={serving.lanes}, buckets={list(serving.bucket_edges or [])}, "
            f"warmup batches={warmed}, arena={serving.arena_bytes >> 20} MiB"
            f"{f' paged ({self.arena.page_kind})' if self.arena.stats()['paged'] else ''}, "
            f"batch planning={planning})")

    def _warmup(self) -> int:
        samples = self.graph.samples()
        calls = warmup_calls(self.spec, samples)
        for requests in calls:
            for outcome in self.engine.infer(requests):
                if isinstance(outcome, RequestError) and samples is None:
                    # Made-up values a model's first step cannot parse (text where it decodes
                    # images): nothing is wrong with the model, it starts cold.
                    self.pb.Logger.log_warn(f"latte: {self.spec.signature.name}: warm-up requests of made-up "
                                            f"values were refused ({outcome}); the model starts cold")
                    return 0
                if isinstance(outcome, Exception):
                    raise RuntimeError(f"warmup of model {self.spec.signature.name!r} failed: {outcome}")
        return len(calls)

    @staticmethod
    def auto_complete_config(auto_complete_model_config, pb):
        additions = autocomplete.complete(auto_complete_model_config.as_dict(), autocomplete.stub_version_dir())
        autocomplete.apply(auto_complete_model_config, additions)
        return auto_complete_model_config

    def execute(self, requests) -> Optional[List]:
        """read -> plan -> run -> answer (docs/backend.md, "The request path"): the reader
        builds the call, the engine plans and runs its batches, each batch's answers are
        built as it finishes. With async_execute the lanes answer through the senders."""
        started = time.perf_counter()
        call = self.reader.read_call(requests)
        if self.vitals is not None:
            return self._execute_marked(requests, call, started)
        if self._async:
            return self._submit(requests, call, started)
        return self._answer(requests, call, started)

    def _execute_marked(self, requests, call, started: float) -> Optional[List]:
        """execute under supervision: the requests that crashed the model before refused, the
        others marked in flight until their answers are out (with async_execute, until the
        sender thread sent the last of them); a suspect of a crash runs alone, after the rest."""
        parts = self.vitals.intake(call, isolate=not self._async)
        if self._async:
            part = parts[0]
            landing = self.vitals.landing(self.vitals.begin(part), part.call.count)
            try:
                return self._submit(requests, part.call, started, landing)
            except BaseException:
                landing.abort()
                raise
        responses = [None] * call.count
        for part in parts:
            slot = self.vitals.begin(part)
            try:
                if part.positions is None:
                    answered = self._answer(requests, part.call, started)
                else:
                    answered = self._answer([requests[i] for i in part.positions], part.call, started)
            finally:
                self.vitals.end(slot)
            self.vitals.ran(part)
            if part.positions is None:
                return answered
            for position, response in zip(part.positions, answered):
                responses[position] = response
        return responses

    def _answer(self, requests, call, started: float) -> List:
        """The call's responses: each batch's answers built as the engine finishes it, sent at
        once where early answers pay (EarlyAnswers), the others returned together."""
        read = time.perf_counter()
        responses = None
        answered = []   # (outcome counts, seconds) of each batch's requests
        pending = call.count
        options = call.options
        responding = 0.0
        early = False   # whether some batch's responses were sent through their senders
        whole = None    # when the common call's one batch began to be answered
        try:
            for answer in self.engine.answers(call):
                begun = time.perf_counter()
                positions, results, _, _, turns = answer
                built = self.responses.answer(answer) if turns is None else \
                    self._settled(self.responses.answer, answer, positions, turns)
                pending -= len(positions)
                if not pending and responses is None and results is None and options is None \
                        and type(positions) is range:
                    responses, whole = built, begun  # the whole call in one batch, all answered with outputs
                    break
                answered.append((self._tally(positions, results, options), begun - started))
                if responses is None:
                    responses = [None] * call.count
                early = self._place(requests, options, positions, built, responses, pending) or early
                responding += time.perf_counter() - begun
        except Exception as exc:
            # A fault outside any one batch: every request not yet answered gets this error.
            responses = self._fail_rest(call, responses, answered, exc, started)
        if whole is not None:  # the common call: its figures folded with its likes
            self._record_plain(call.count, read - started, whole - read, time.perf_counter() - whole)
            return responses
        engine_s = time.perf_counter() - read - responding
        if early:
            responses = [None if response is _SENT else response for response in responses]
        self.metrics.call(call.count, read - started, engine_s, responding, answered, self._take_batches())
        return responses

    def _settled(self, build, made_of, positions, turns) -> List:
        """The responses `build(made_of)` makes, the session turns among `positions` settled
        once they are made: committed where a response carries outputs, released where it could
        not be made."""
        if not turns:
            return build(made_of)
        built = None
        try:
            built = build(made_of)
            return built
        finally:
            self.engine.settle(turns, self._carrying_outputs(positions, built, turns))

    @staticmethod
    def _carrying_outputs(positions, responses, turns) -> List[int]:
        """The positions among `turns` whose built response carries outputs (none when the
        responses could not be built at all)."""
        if responses is None:
            return []
        return [position for position, response in zip(positions, responses)
                if position in turns and not response.has_error()]

    def _place(self, requests, options, positions, built: List, responses: List, pending: int) -> bool:
        """A batch's responses at their requests' places in the call's list, then sent now
        through their response senders where that pays (each sent one marked _SENT; True).
        Placed first, so the requests still to run are the ones without a response."""
        for position, response in zip(positions, built):
            responses[position] = response
        if pending and self.early.now(_top_priority(positions, options), pending,
                                      lambda: _lowest_waiting(responses, options)):
            self._send_early(requests, positions, built, responses)
            return True
        return False

    def _fail_rest(self, call, responses: Optional[List], answered: List, exc: Exception, started: float) -> List:
        """Every request of the call not answered yet, answered with the model's failure."""
        failure = model_failure(self.spec.signature.name, exc)
        if responses is None:
            responses = [None] * call.count
        unanswered = [i for i, response in enumerate(responses) if response is None]
        answered.append((self._tally(unanswered, [failure] * len(unanswered), call.options),
                         time.perf_counter() - started))
        for position in unanswered:
            responses[position] = self.responses.build(failure)
        return responses

    def _record_plain(self, requests: int, read_s: float, engine_s: float, respond_s: float) -> None:
        """The figures of the common call, folded with its likes: one model call answered every
        request with outputs at default priority."""
        records = self.engine.runner.records
        if len(records) != 1:  # the batch went unrecorded (a cost model being timed), or others wait
            self.metrics.call(requests, read_s, engine_s, respond_s, [({_SUCCESS: requests}, read_s + engine_s)],
                              self._take_batches())
            return
        rows, count, _, seconds, _, model_s = records.popleft()
        self.early.batch_done(count, seconds)
        self.metrics.plain_call(requests, read_s, engine_s, respond_s, rows, model_s)

    def _take_batches(self) -> List[Tuple[int, float, bool]]:
        """(rows, model seconds, failed) of the batches the engine ran since the last take (lanes
        running a call's batches record them before the call's last answer is in); each one's
        time also feeds the estimate of when early answers pay."""
        batches = []
        for rows, count, _, seconds, failed, model_s in self.engine.runner.take_records():
            self.early.batch_done(count, seconds)
            batches.append((rows, model_s, failed))
        return batches

    def _send_early(self, requests, positions, built: List, responses: List) -> None:
        """Send a finished batch's responses through their response senders now (EarlyAnswers),
        each marked _SENT as it goes; one whose sender cannot be had stays in the returned list."""
        begun = time.perf_counter()
        for position, response in zip(positions, built):
            try:
                sender = requests[position].get_response_sender()
            except Exception as exc:
                self.pb.Logger.log_error(f"latte: {self.spec.signature.name}: no response sender ({exc}); "
                                         "the response goes back with the call")
                continue
            self._send(sender, response)
            responses[position] = _SENT
        self.early.sent(len(built), time.perf_counter() - begun)

    def _submit(self, requests, call, started: float, landing: Optional[vitals.Landing] = None) -> None:
        """async_execute: hand the requests to the lanes and return, so Triton can deliver the
        next call while these run; each is answered through its response sender when done
        (and counted off `landing`, once sent, where the call is marked in flight).

        Triton frees a request's input tensors when execute returns, so they are copied first.
        """
        read = time.perf_counter()
        items, options = call.items, call.options
        for item in items:
            if not isinstance(item, Exception):
                item.inputs = {name: np.array(array, copy=True) for name, array in item.inputs.items()}
        senders = [request.get_response_sender() for request in requests]
        answered = set()
        lock = threading.Lock()  # lanes answer from their own threads

        def answer(outcomes, turns=None) -> None:
            with lock:
                fresh = [(position, outcome) for position, outcome in outcomes if position not in answered]
                answered.update(position for position, _ in fresh)
            self._queue_answers(fresh, turns, senders, options, started, landing)

        try:
            self.engine.submit(items, options, answer)
        except Exception as exc:
            # Submission fails before anything is queued; answer whatever is not answered yet.
            failure = ModelError(f"model {self.spec.signature.name!r} could not queue the request: {type(exc).__name__}: {exc}")
            answer([(position, failure) for position in range(len(requests))])
        self.metrics.execute(len(requests), read - started, time.perf_counter() - read, 0.0)
        return None

    def _queue_answers(self, fresh, turns, senders, options, started: float,
                       landing: Optional[vitals.Landing]) -> None:
        """(position, outcome) pairs answered by a lane, counted, made into responses (their
        session turns settled before the responses go, so a session's next request finds this
        prefix) and queued for the sender thread: each send is a round trip to the server, and
        the lane goes on to its next batch meanwhile."""
        positions = [position for position, _ in fresh]
        outcomes = [outcome for _, outcome in fresh]
        self.metrics.requests(self._tally(positions, outcomes, options), time.perf_counter() - started)
        built = self._settled(self._build_each, outcomes, positions, turns)
        if fresh:
            self._outbox.put((-_top_priority(positions, options), next(self._sequence),
                              [(senders[position], response) for position, response in zip(positions, built)],
                              landing))

    def _build_each(self, outcomes) -> List:
        return [self.responses.build(outcome) for outcome in outcomes]

    def _send_responses(self) -> None:
        while True:
            _, _, batch, landing = self._outbox.get()
            if batch is None:
                return
            for sender, response in batch:
                self._send(sender, response)
            if landing is not None:
                landing.sent(len(batch))

    def _tally(self, positions, results, options) -> dict:
        """(outcome label, priority) -> how many, for a batch's answered requests (`results`
        None: all answered with outputs); a model failure's whole text (the client got one
        line of it) goes to the server log."""
        if results is None:
            if options is None:
                return {_SUCCESS: len(positions)}
            results = [None] * len(positions)
        counts = {}
        for position, outcome in zip(positions, results):
            opts = options[position] if options is not None else None
            priority = opts.priority if opts is not None else 0
            if isinstance(outcome, Exception):
                key = (outcome_label(outcome), priority)
                if isinstance(outcome, ModelError) and outcome.detail:
                    self.pb.Logger.log_error(f"latte: {self.spec.signature.name}: {outcome}\n{outcome.detail}")
            else:
                key = ("success", priority)
            counts[key] = counts.get(key, 0) + 1
        return counts

    def _send(self, sender, response) -> None:
        """A request's one final response, through its response sender."""
        try:
            sender.send(response, flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as exc:  # the client may be gone; the other requests still get theirs
            self.pb.Logger.log_error(f"latte: {self.spec.signature.name}: could not send a response: {exc}")

    def _refresh_gauges(self) -> None:
        if self._async and self._serving:  # the lanes' batches, counted off the request path
            for rows, model_s, failed in self._take_batches():
                self.metrics.batch(rows, model_s, failed)
        if self.dispatcher is not None:
            self.metrics.scheduler(self.dispatcher.metrics())
        self.metrics.arena(self.arena.stats())
        self.metrics.resident_memory(rss_bytes(os.getpid()))  # the alert on its growth reads it
        device = device_memory.figures(self.spec.serving)
        if device is not None:
            self.metrics.device_memory(*device)
        self.metrics.steps(self.graph.step_figures())
        if self.sessions is not None:
            self.sessions.reap()
            s = self.sessions.stats()
            self.metrics.sessions(s.live, s.started, s.ended, s.expired)

    def finalize(self) -> None:
        gc.unfreeze()  # what the model held can be collected again once it is gone
        self._close()

    def _close(self) -> None:
        stop_parts(self.pb, self.spec.signature.name,
                   (("metrics publisher", self.publisher and self.publisher.close),
                    ("scheduler lanes", self.dispatcher and self.dispatcher.close),
                    ("response sender", self._sender and self._stop_sender),
                    ("model", self.graph and self.graph.close),
                    ("flight file", self.vitals and self.vitals.close)))
        memory_resource.release(self.arena.empty)

    def _stop_sender(self) -> None:
        self._outbox.put((_LAST, next(self._sequence), None, None))  # after every answer still waiting
        self._sender.join(timeout=5.0)
