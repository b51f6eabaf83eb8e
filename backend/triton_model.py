"""What `model.py` delegates to: load once, then turn requests into responses."""

from __future__ import annotations

import threading
import time
from typing import List, Optional

from latte.backend import autocomplete
from latte.backend.buckets import BucketPlan
from latte.backend.config import parse_args, parse_model_config, usable_core_ids
from latte.backend.engine import BatchEngine, BatchRecord
from latte.backend.lanes import LaneDispatcher
from latte.backend.metrics import BackendMetrics, TritonPublisher, outcome_label
from latte.backend.options import read_options
from latte.backend.precision import load_at_precision
from latte.backend.requests import RequestCancelled, RequestError, RequestReader
from latte.backend.responses import ResponseBuilder
from latte.backend.sessions import SessionStore
from latte.backend.warmup import warmup_requests, warmup_shapes
from latte.memory import BuddyArena


def lane_cpus(spec) -> Optional[List[List[int]]]:
    """CPU sets for pinned lanes (parameter pin_lanes), intra_op_threads cores each.

    Unpinned by default: several models in one server would otherwise all pin their first
    lane to the same core.
    """
    if not spec.pin_lanes:
        return None
    cores = sorted(usable_core_ids())
    per = spec.intra_op_threads
    return [cores[i * per:(i + 1) * per] for i in range(spec.lanes)]


def instance_device(args) -> str:
    if str(args.get("model_instance_kind", "CPU")).upper() == "GPU":
        return f"cuda:{int(args.get('model_instance_device_id', 0))}"
    return "cpu"


class LatteModel:
    def __init__(self, args, pb) -> None:
        self.pb = pb
        config, model_dir, version = parse_args(args)
        self.spec = spec = parse_model_config(config, model_dir, version, device=instance_device(args))
        self.runtime, accuracy = load_at_precision(spec, warmup_shapes(spec))
        if accuracy is not None:
            pb.Logger.log_info(f"latte: {spec.name}: {accuracy.text()}")
        # Batch buffers and session state live here, so memory stays flat however shapes vary.
        self.arena = BuddyArena(spec.arena_bytes, "cpu")
        allocate = self.arena.empty
        self.sessions = (SessionStore(spec.session_ttl_s, spec.max_sessions, spec.max_sequence_length, allocate)
                         if spec.session_input else None)
        self.metrics = BackendMetrics()
        self.reader = RequestReader(spec)
        self.engine = BatchEngine(
            spec, self.runtime, buckets=BucketPlan(spec.bucket_edges) if spec.bucket_edges else None,
            sessions=self.sessions, session_input=spec.session_input, allocate=allocate, on_batch=self._on_batch,
        )
        self.dispatcher = None
        if spec.scheduler == "affinity":
            self.dispatcher = self.engine.dispatcher = LaneDispatcher(self.engine, spec.lanes, lane_cpus(spec))
        self.responses = ResponseBuilder(pb, [t.name for t in spec.outputs])
        # Publishing is off the request path: each Triton metric update is a round trip to the server.
        self.publisher = TritonPublisher(pb, self.metrics.aggregate, spec.name, refresh=self._refresh_gauges)
        warmed = self._warmup() if spec.warmup else 0
        pb.Logger.log_info(
            f"latte: {spec.name} ready ({spec.runtime}, {spec.model_path.name}, max_batch_size={spec.max_batch_size}, "
            f"intra_op_threads={spec.intra_op_threads}, scheduler={spec.scheduler}, lanes={spec.lanes}, buckets={list(spec.bucket_edges or [])}, "
            f"warmup batches={warmed}, arena={spec.arena_bytes >> 20} MiB)"
        )

    def _warmup(self) -> int:
        requests = warmup_requests(self.spec)
        for outcome in self.engine.infer(requests):
            if isinstance(outcome, Exception):
                raise RuntimeError(f"warmup of model {self.spec.name!r} failed: {outcome}")
        return len(requests)

    @staticmethod
    def auto_complete_config(auto_complete_model_config, pb):
        additions = autocomplete.complete(auto_complete_model_config.as_dict(), autocomplete.stub_version_dir())
        autocomplete.apply(auto_complete_model_config, additions)
        return auto_complete_model_config

    def execute(self, requests) -> Optional[List]:
        started = time.monotonic()
        parsed, options = [], []
        spec_checks_cancel = self.spec.check_cancellation
        for request in requests:
            try:
                # Each is_cancelled() is a round trip to the server; Triton itself already drops
                # requests cancelled while queued, so the check here is opt-in.
                if spec_checks_cancel and request.is_cancelled():
                    raise RequestCancelled("the client cancelled this request before it ran")
                item = self.reader.read(request)
                opts = read_options(item.parameters, triton_timeout_us=item.timeout_us)
            except (RequestError, RequestCancelled) as exc:
                item, opts = exc, None
            except Exception as exc:  # a reader bug must still answer this request alone
                item, opts = RequestError(f"could not read request: {type(exc).__name__}: {exc}"), None
            parsed.append(item)
            options.append(opts)
        if len({opts.priority for opts in options if opts is not None}) > 1:
            return self._answer_as_ready(requests, parsed, options, started)
        outcomes = self.engine.infer(parsed, options)
        elapsed = time.monotonic() - started
        for outcome, opts in zip(outcomes, options):
            error = outcome if isinstance(outcome, Exception) else None
            self.metrics.request(outcome_label(error), opts.priority if opts else 0, elapsed)
        return [self.responses.build(outcome) for outcome in outcomes]

    def _answer_as_ready(self, requests, parsed, options, started: float) -> None:
        """A call that mixes priority levels answers each request as soon as its batch is done,
        so higher priorities reach their clients first instead of when the whole call ends.

        Each send is a round trip to the server, where returning the list is one; calls of a
        single priority level keep the cheaper way. Non-decoupled models may send one final
        response per request through the response sender and then return None.
        """
        final = self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        senders = [request.get_response_sender() for request in requests]
        answered = set()  # positions; lanes add to it, so under a lock
        lock = threading.Lock()

        def answer(position: int, outcome) -> None:
            with lock:
                if position in answered:
                    return
                answered.add(position)
            error = outcome if isinstance(outcome, Exception) else None
            opts = options[position]
            self.metrics.request(outcome_label(error), opts.priority if opts else 0, time.monotonic() - started)
            try:
                senders[position].send(self.responses.build(outcome), flags=final)
            except Exception as exc:  # one failed send must not keep the other requests from their answers
                self.pb.Logger.log_error(f"latte: {self.spec.name}: could not send a response: {exc}")

        try:
            self.engine.infer(parsed, options, on_result=answer)
        except Exception as exc:  # an engine bug still owes every request its one answer
            failure = RuntimeError(f"model {self.spec.name!r} failed: {type(exc).__name__}: {exc}")
            for position in range(len(requests)):
                answer(position, failure)
        return None

    def _on_batch(self, record: BatchRecord) -> None:
        self.metrics.batch(record.rows, record.seconds)

    def _refresh_gauges(self) -> None:
        if self.dispatcher is not None:
            self.metrics.scheduler(self.dispatcher.metrics())
        self.metrics.arena(self.arena.stats())
        if self.sessions is not None:
            self.sessions.reap()
            s = self.sessions.stats()
            self.metrics.sessions(s.live, s.started, s.ended, s.expired)

    def finalize(self) -> None:
        self.publisher.close()
        if self.dispatcher is not None:
            self.dispatcher.close()
        self.runtime.close()
