"""What `model.py` delegates to: load once, then turn requests into responses."""

from __future__ import annotations

import gc
import itertools
import os
import queue
import threading
import time
from typing import List, Optional, Tuple

import numpy as np

from latte.backend import autocomplete, device_memory, memory_resource
from latte.backend.buckets import BucketPlan
from latte.backend.config import parse_args, parse_model_config, thread_budget_warning, usable_core_ids
from latte.backend.engine import BatchEngine, ModelError, model_failure
from latte.backend.lanes import LaneDispatcher
from latte.backend.metrics import BackendMetrics, TritonPublisher, outcome_label
from latte.backend.options import read_options
from latte.backend.precision import load_at_precision
from latte.backend.requests import NO_PARAMETERS, ParsedRequest, RequestError, RequestReader
from latte.backend.responses import EarlyAnswers, ResponseBuilder
from latte.backend.sessions import SessionStore
from latte.backend.warmup import measure_cost_model, warmup_calls, warmup_shapes
from latte.bench.procmem import rss_bytes
from latte.memory import BuddyArena


_UNANSWERED = object()  # a request of the running execute call with no outcome yet
_SENT = object()        # one already answered through its response sender
_LAST = float("inf")    # the outbox key that sorts after every priority
_SUCCESS = ("success", 0)  # the tally key of a request answered with outputs at default priority


def _top_priority(outcomes, options) -> int:
    if options is None:
        return 0
    return max((options[p].priority if options[p] is not None else 0) for p, _ in outcomes)


def _lowest_waiting(results, options) -> int:
    """The lowest priority among the call's requests still to run."""
    if options is None:
        return 0
    return min((o.priority if o is not None else 0) for o, r in zip(options, results) if r is _UNANSWERED)


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


def instance_device(args) -> str:
    if str(args.get("model_instance_kind", "CPU")).upper() == "GPU":
        return f"cuda:{int(args.get('model_instance_device_id', 0))}"
    return "cpu"


class LatteModel:
    def __init__(self, args, pb) -> None:
        self.pb = pb
        config, model_dir, version = parse_args(args)
        self.spec = spec = parse_model_config(config, model_dir, version, device=instance_device(args))
        self._async = spec.serving.async_execute  # asked on every call
        self._check_cancellation = spec.serving.check_cancellation
        oversubscribed = thread_budget_warning(spec)
        if oversubscribed is not None:
            pb.Logger.log_warn(f"latte: {oversubscribed}")
        # Batch buffers, a graph's intermediates and session state live here, so memory stays
        # flat however shapes vary.
        self.arena = BuddyArena(spec.serving.arena_bytes, "cpu")
        memory_resource.use(self.arena.empty)
        device_memory.use(spec.serving)  # before the model's first CUDA tensor
        self.runtime = self.dispatcher = self.publisher = self._sender = None
        self._serving = False  # set once loaded: warm-up's batches are not served ones
        try:
            self._load(args)
        except BaseException:
            self._close()  # what loaded goes; the load's own error is the one raised
            raise

    def _load(self, args) -> None:
        spec, pb = self.spec, self.pb
        signature, serving = spec.signature, spec.serving
        self.runtime, accuracy = load_at_precision(spec, warmup_shapes(spec))
        if accuracy is not None:
            pb.Logger.log_info(f"latte: {signature.name}: {accuracy.text()}")
        self.sessions = self._sessions()
        self.metrics = BackendMetrics()
        self.metrics.thread_budget(serving.thread_budget.state, serving.thread_budget.threads)
        self.reader = RequestReader(spec)
        self.engine = BatchEngine(spec, self.runtime, sessions=self.sessions, session_input=serving.session_input)
        self.planner = self.engine.planner
        if serving.scheduler == "affinity":
            window = serving.batch_window_us / 1e6 if serving.async_execute else 0.0
            self.dispatcher = self.engine.dispatcher = LaneDispatcher(self.engine, serving.lanes, lane_cpus(spec),
                                                                      queue_capacity=serving.max_queue_size,
                                                                      max_window_s=window)
        self.responses = ResponseBuilder(pb, [t.name for t in signature.outputs])
        # A plain call of a model whose requests share one shape key is read by input, any
        # other request by request; with async_execute the lanes answer through the senders.
        self._by_columns = (self.engine.reads_columns and not serving.async_execute
                            and not serving.check_cancellation)
        # A one-batch plan is answered with views of the batch's outputs, unless outputs are cut
        # back to each request's own length (split does that).
        self._views = not signature.trimmed_outputs and not self.runtime.trims_outputs
        self.early = EarlyAnswers(serving.respond)
        # Answers of async_execute wait here for the sender thread, highest priority_level first
        # (then in the order they finished): (-priority, sequence number, [(sender, outcome)]).
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
        return SessionStore(serving.session_ttl_s, serving.max_sessions, serving.max_sequence_length)

    def _ready(self, warmed: int) -> None:
        """The cost model measured, the collector told to leave what loaded alone, and the
        ready line logged."""
        signature, serving = self.spec.signature, self.spec.serving
        self.engine.take_records()  # load's own batches are not served ones
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
        described = self.runtime.describe()
        steps = f", {described}" if described else ""
        self.pb.Logger.log_info(
            f"latte: {signature.name} ready ({signature.runtime}, {signature.model_path.name}{steps}, "
            f"max_batch_size={signature.max_batch_size}, intra_op_threads={serving.intra_op_threads}, "
            f"scheduler={serving.scheduler}, lanes={serving.lanes}, buckets={list(serving.bucket_edges or [])}, "
            f"warmup batches={warmed}, arena={serving.arena_bytes >> 20} MiB, "
            f"batch planning={planning})")

    def _warmup(self) -> int:
        samples = self.runtime.samples()
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

    def execute(self, requests) -> List:
        """read -> plan -> run -> answer: a plain call of a model read by input (the common
        call) on the column route; any other call read request by request, its batches run
        inline (or on the lanes with async_execute) and each answered with its own outcome."""
        started = time.perf_counter()
        if self._by_columns:
            responses = self._execute_columns(requests, started)
            if responses is not None:
                return responses
        call = self.reader.read_call(requests, self._check_cancellation)
        items = call.items
        options = None if call.plain else self._options(items)
        read = time.perf_counter()
        if self._async:
            self._submit(requests, items, options, started)
            self.metrics.execute(len(requests), read - started, time.perf_counter() - read, 0.0)
            return None
        results, answered, responding = self._run_call(requests, items, options, started)
        ran = time.perf_counter()
        if options is None and not responding and all(type(r) is dict for r in results):
            # Every request answered with outputs at default priority, none early: the plain
            # call's responses and figures (the whole call was one batch, or its plan's batches).
            responses = self.responses.successes(results)
            self._record_plain(len(requests), read - started, ran - read, time.perf_counter() - ran)
            return responses
        responses = self.responses.build_all(results, skip=_SENT)
        # The early sends happened inside the engine's time; the final responses after it.
        engine_s = ran - read - responding
        responding += time.perf_counter() - ran
        self.metrics.call(len(requests), read - started, engine_s, responding, answered, self._take_batches())
        return responses

    def _run_call(self, requests, items, options, started: float):
        """Each request's outcome as the engine yields it (_SENT once answered early through its
        sender), the (outcome counts, seconds) of each group answered, and the seconds spent
        sending early."""
        results = [_UNANSWERED] * len(requests)
        pending = len(requests)
        responding = 0.0
        answered = []
        try:
            for outcomes in self.engine.answers(items, options):
                pending -= len(outcomes)
                answered.append((self._tally(outcomes, options), time.perf_counter() - started))
                for position, outcome in outcomes:
                    results[position] = outcome
                if pending and self.early.now(_top_priority(outcomes, options), pending,
                                              lambda: _lowest_waiting(results, options)):
                    responding += self._send_early(requests, outcomes, results)
        except Exception as exc:
            # A fault outside any one batch: every request not yet answered gets this error.
            failure = model_failure(self.spec.signature.name, exc)
            failed = [(i, failure) for i, r in enumerate(results) if r is _UNANSWERED]
            answered.append((self._tally(failed, options), time.perf_counter() - started))
            for position, _ in failed:
                results[position] = failure
        return results, answered, responding

    def _execute_columns(self, requests, started: float) -> Optional[List]:
        """A plain call of a model whose requests share one shape key: read by input, planned
        from the rows and lengths the native check measured (one batch when they fit), each
        batch packed natively; no per-request object on the way. None when the call is anything
        else (a request to refuse, parameters, a timeout) or its plan has batches to answer
        early (EarlyAnswers): the general path then reads it, before anything has run."""
        columns = self.reader.read_columns(requests)
        if columns is None:
            return None
        plan = self.planner.plan(columns.rows, columns.lengths)
        if len(plan) > 1 and self.early.pays():
            return None
        read = time.perf_counter()
        outputs = None
        if len(plan) == 1 and self._views:
            outputs, results = self.engine.run_whole(columns)
        else:
            results = self.engine.run_columns(columns, plan)
        ran = time.perf_counter()
        if outputs is not None:
            responses = self.responses.from_batch(outputs, columns.rows)
        elif all(type(r) is dict for r in results):
            responses = self.responses.successes(results)
        else:
            # A batch failed and its requests ran alone: each answered with its own outcome.
            responses = self.responses.build_all(results)
            answered = [(self._tally(list(enumerate(results)), None), ran - started)]
            self.metrics.call(len(requests), read - started, ran - read, time.perf_counter() - ran, answered,
                              self._take_batches())
            return responses
        self._record_plain(len(requests), read - started, ran - read, time.perf_counter() - ran)
        return responses

    def _record_plain(self, requests: int, read_s: float, engine_s: float, respond_s: float) -> None:
        """Metrics of a call whose every request was answered with outputs at default priority."""
        records = self.engine.records
        if len(records) == 1:  # one model call: the common case, folded with its likes
            rows, count, _, seconds, _, model_s = records.popleft()
            self.early.batch_done(count, seconds)
            self.metrics.plain_call(requests, read_s, engine_s, respond_s, rows, model_s)
        else:
            self.metrics.call(requests, read_s, engine_s, respond_s, [({_SUCCESS: requests}, read_s + engine_s)],
                              self._take_batches())

    def _take_batches(self) -> List[Tuple[int, float, bool]]:
        """(rows, model seconds, failed) of the batches the engine ran since the last take (lanes
        running a call's batches record them before the call's last answer is in); each one's
        time also feeds the estimate of when early answers pay."""
        batches = []
        for rows, count, _, seconds, failed, model_s in self.engine.take_records():
            self.early.batch_done(count, seconds)
            batches.append((rows, model_s, failed))
        return batches

    def _send_early(self, requests, outcomes, results) -> float:
        """Answer a finished group through its response senders now (see EarlyAnswers)."""
        begun = time.perf_counter()
        for position, outcome in outcomes:
            results[position] = _SENT
            self._send(requests[position].get_response_sender(), outcome)
        took = time.perf_counter() - begun
        self.early.sent(len(outcomes), took)
        return took

    def _options(self, items) -> Optional[List]:
        """Each readable request's options (read_options gives the shared defaults to one that
        sends no parameters); a request whose parameters are wrong becomes its RequestError.
        None when no request carries a parameter or a timeout: all run with the defaults."""
        for item in items:
            if type(item) is ParsedRequest and (item.parameters is not NO_PARAMETERS or item.timeout_us > 0):
                break
        else:
            return None
        options = []
        for i, item in enumerate(items):
            if isinstance(item, Exception):
                options.append(None)
            else:
                try:
                    options.append(read_options(item.parameters, triton_timeout_us=item.timeout_us))
                except RequestError as exc:
                    items[i] = exc
                    options.append(None)
        return options

    def _submit(self, requests, parsed, options, started: float) -> None:
        """async_execute: hand the requests to the lanes and return, so Triton can deliver the
        next call while these run; each is answered through its response sender when done.

        Triton frees a request's input tensors when execute returns, so they are copied first.
        """
        for item in parsed:
            if not isinstance(item, Exception):
                item.inputs = {name: np.array(array, copy=True) for name, array in item.inputs.items()}
        senders = [request.get_response_sender() for request in requests]
        answered = set()
        lock = threading.Lock()  # lanes answer from their own threads

        def answer(outcomes) -> None:
            with lock:
                fresh = [(position, outcome) for position, outcome in outcomes if position not in answered]
                answered.update(position for position, _ in fresh)
            self._account(fresh, options, started)
            # Each send is a round trip to the server: a thread of its own makes them, so the
            # lane goes on to its next batch.
            if fresh:
                self._outbox.put((-_top_priority(fresh, options), next(self._sequence),
                                  [(senders[position], outcome) for position, outcome in fresh]))

        try:
            self.engine.submit(parsed, options, answer)
        except Exception as exc:
            # Submission fails before anything is queued; answer whatever is not answered yet.
            failure = ModelError(f"model {self.spec.signature.name!r} could not queue the request: {type(exc).__name__}: {exc}")
            answer([(position, failure) for position in range(len(requests))])
        return None

    def _send_responses(self) -> None:
        while True:
            _, _, batch = self._outbox.get()
            if batch is None:
                return
            for sender, outcome in batch:
                self._send(sender, outcome)

    def _account(self, outcomes, options, started: float) -> None:
        """Count a group of answered requests of an async_execute call as they are answered."""
        self.metrics.requests(self._tally(outcomes, options), time.perf_counter() - started)

    def _tally(self, outcomes, options) -> dict:
        """(outcome label, priority) -> how many, for a group of answered requests; a model
        failure's whole text (the client got one line of it) goes to the server log."""
        counts = {}
        for position, outcome in outcomes:
            if isinstance(outcome, Exception):
                opts = options[position] if options is not None else None
                key = (outcome_label(outcome), opts.priority if opts is not None else 0)
                if isinstance(outcome, ModelError) and outcome.detail:
                    self.pb.Logger.log_error(f"latte: {self.spec.signature.name}: {outcome}\n{outcome.detail}")
            elif options is None:
                key = _SUCCESS
            else:
                opts = options[position]
                key = ("success", opts.priority if opts is not None else 0)
            counts[key] = counts.get(key, 0) + 1
        return counts

    def _send(self, sender, outcome) -> None:
        """A request's one final response, through its response sender."""
        try:
            sender.send(self.responses.build(outcome), flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
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
            self.metrics.device_memory(device, device_memory.arena_failures(self.spec.serving))
        self.metrics.steps(self.runtime.step_figures())
        if self.sessions is not None:
            self.sessions.reap()
            s = self.sessions.stats()
            self.metrics.sessions(s.live, s.started, s.ended, s.expired)

    def finalize(self) -> None:
        gc.unfreeze()  # what the model held can be collected again once it is gone
        self._close()

    def _close(self) -> None:
        """Stop what the model started, the last started first; a part that fails to stop is
        logged and the others still stop (after a failed load, its error stays the one told)."""
        for part, stop in (("metrics publisher", self.publisher and self.publisher.close),
                           ("scheduler lanes", self.dispatcher and self.dispatcher.close),
                           ("response sender", self._sender and self._stop_sender),
                           ("runtime", self.runtime and self.runtime.close)):
            if stop:
                try:
                    stop()
                except Exception as exc:
                    self.pb.Logger.log_error(f"latte: {self.spec.signature.name}: stopping the {part} failed: "
                                             f"{type(exc).__name__}: {exc}")
        memory_resource.release(self.arena.empty)

    def _stop_sender(self) -> None:
        self._outbox.put((_LAST, next(self._sequence), None))  # after every answer still waiting
        self._sender.join(timeout=5.0)
