"""What `model.py` delegates to for a streaming model (decoupled, its version folder holding a
stream.json): load the two graphs and the pools, then hand each request to the iteration loop
as a stream, and send what each iteration made through the streams' response senders."""

from __future__ import annotations

import os
import threading
import time
import traceback
from typing import List, Optional

from latte.backend import memory_resource
from latte.backend.config import parse_args, parse_model_config, parameters_of, thread_budget_warning
from latte.backend.dtypes import NUMPY_TO_TRITON, is_string
from latte.backend.errors import ConfigError, ModelError, RequestError
from latte.backend.graph.graph import Graph
from latte.backend.metrics import BackendMetrics, TritonPublisher
from latte.backend.requests import RequestReader
from latte.backend.responses import ResponseBuilder
from latte.backend.streaming.controls import (CONTROL_INPUTS, STREAM_OUTPUTS, check_additional_outputs,
                                              check_not_written, read_controls)
from latte.backend.streaming.definition import check_outputs, load_stream
from latte.backend.streaming.engine import StreamEngine
from latte.backend.streaming.options import parse_stream_options
from latte.backend.streaming.runner import Ready, StreamRunner
from latte.backend.streaming.scheduler import StreamScheduler
from latte.backend.streaming.streams import Stream
from latte.backend.triton_model import host_arena, instance_device, stop_parts
from latte.bench.procmem import rss_bytes


def is_decoupled(config) -> bool:
    return bool((config.get("model_transaction_policy") or {}).get("decoupled", False))


def _graph(graph_definition, serving) -> Graph:
    return Graph(graph_definition.path, [t.name for t in graph_definition.inputs],
                 [t.name for t in graph_definition.outputs], serving.intra_op_threads, serving.inter_op_threads,
                 serving.device, serving.freeze)


class StreamingModel:
    def __init__(self, args, pb) -> None:
        self.pb = pb
        self._instance = args.get("model_instance_name", "")
        config, model_dir, version = parse_args(args)
        self.spec = spec = parse_model_config(config, model_dir, version, device=instance_device(args))
        self.name = name = spec.signature.name
        if spec.signature.runtime != "stream":
            raise ConfigError(f"model {name!r}: a decoupled latte model streams: its version folder holds a "
                              f"stream.json (docs/streaming.md), found {spec.signature.model_path.name}")
        if not is_decoupled(config):
            raise ConfigError(f"model {name!r}: a streaming model sends many responses per request; set "
                              "model_transaction_policy { decoupled: true }")
        warning = thread_budget_warning(spec)
        if warning is not None:
            pb.Logger.log_warn(f"latte: {warning}")
        self.arena = host_arena(pb, spec)
        self.start_graph = self.step_graph = self.runner = self.publisher = None
        self._senders = []
        try:
            self._load(config)
        except BaseException:
            self._close()
            raise

    def _load(self, config) -> None:
        spec, name, serving = self.spec, self.name, self.spec.serving
        self.definition = definition = load_stream(spec.signature.model_path)
        self._check_definition(definition)
        self.options = options = parse_stream_options(name, parameters_of(config), definition)
        self.start_graph = _graph(definition.start, serving)
        self.step_graph = _graph(definition.step, serving)
        outputs = [t.name for t in spec.signature.outputs]
        self.engine = self._new_engine(definition, options, [n for n in outputs if n not in STREAM_OUTPUTS])
        self.reader = RequestReader(spec)
        self.responses = ResponseBuilder(self.pb, outputs, as_given=True)
        self._declares_stream = any(t.name == "stream" for t in spec.signature.inputs)
        self._text = next((t.name for t in spec.signature.outputs
                           if is_string(t.dtype) and t.name not in STREAM_OUTPUTS), None)
        self._prompt = next((t.name for t in spec.signature.inputs
                             if is_string(t.dtype) and t.name not in CONTROL_INPUTS), None)
        self.metrics = BackendMetrics()  # before the senders, which record each output sent
        self.metrics.thread_budget(serving.thread_budget.state, serving.thread_budget.threads)
        self._start_runner(options)
        self.publisher = TritonPublisher(self.pb, self.metrics.aggregate, name, refresh=self._refresh_gauges,
                                         instance=self._instance)
        self._log_ready()

    def _check_definition(self, definition) -> None:
        """The stream's programs against the model config: outputs declared and not written
        twice, every input the start program reads declared."""
        spec, name = self.spec, self.name
        declared = {t.name: NUMPY_TO_TRITON[t.dtype] for t in spec.signature.outputs}
        check_additional_outputs(name, {t.name: NUMPY_TO_TRITON[t.dtype] for t in spec.signature.inputs}, declared)
        check_not_written(name, {t.name for graph in (definition.start, definition.step) for t in graph.outputs
                                 if t.name in declared})
        check_outputs(definition, {n: t for n, t in declared.items() if n not in STREAM_OUTPUTS})
        missing = [n for n in definition.start_inputs if n not in {t.name for t in spec.signature.inputs}]
        if missing:
            raise ConfigError(f"model {name!r}: {definition.start.path.name} reads {missing}, which the model "
                              "config does not declare as inputs")

    def _new_engine(self, definition, options, outputs) -> StreamEngine:
        """The engine over the stream pools in the arena, its batches' minimum rows set (asked
        for, or measured)."""
        try:
            engine = StreamEngine(self.name, definition, self.start_graph, self.step_graph, options, outputs)
        except MemoryError as exc:
            raise ConfigError(f"model {self.name!r}: the stream pools do not fit arena_bytes="
                              f"{self.spec.serving.arena_bytes}: {exc}; lower max_streams or cache_blocks, or raise "
                              "arena_bytes") from None
        engine.min_rows, self._rows_found = ((options.min_batch_rows, "") if options.min_batch_rows
                                             else self._invariant_rows(engine, options.max_streams))
        return engine

    def _start_runner(self, options) -> None:
        """The scheduler and the loop that runs it, and a sender thread per outbox."""
        scheduler = StreamScheduler(options.max_streams, options.joins_per_iteration, options.max_waiting)
        self.runner = StreamRunner(self.engine, scheduler, options.cancel_check_ms / 1000.0,
                                   options.cancel_checks_per_s, outboxes=options.response_threads,
                                   prepare=self._prepare, send=self._send_guarded, log_error=self.pb.Logger.log_error)
        self._senders = [threading.Thread(target=self._send_loop, args=(outbox,),
                                          name=f"latte-stream-sender-{self.name}", daemon=True)
                         for outbox in self.runner.outboxes]
        for sender in self._senders:
            sender.start()
        self.runner.start(self.name)

    def _log_ready(self) -> None:
        engine, options, cache = self.engine, self.options, self.definition.cache
        held = engine.held()
        self.pb.Logger.log_info(
            f"latte: {self.name} ready (streaming: start {self.start_graph.describe() or 'graph'}; step "
            f"{self.step_graph.describe() or 'graph'}; max_streams={options.max_streams}, joins_per_iteration="
            f"{options.joins_per_iteration}, max_tokens={options.max_tokens}"
            + (f", cache {options.cache_blocks} blocks of {cache.block_tokens} tokens "
               f"({engine.cache.block_bytes * options.cache_blocks >> 10} KiB)" if cache else "")
            + f", state {held['state_slots']}/{options.max_streams} slots, min_batch_rows={engine.min_rows}"
            + f"{self._rows_found}, arena={self.spec.serving.arena_bytes >> 20} MiB)")

    def _invariant_rows(self, engine: StreamEngine, max_streams: int):
        """min_batch_rows auto: the count measured (never past max_streams, where every batch
        is padded alike already), and how it was found, for the ready line."""
        try:
            return min(engine.measure_invariant_rows(max_streams), max_streams), " (measured)"
        except Exception as exc:  # the step refuses made-up state: served unpadded, as before
            self.pb.Logger.log_warn(f"latte: {self.name}: min_batch_rows could not be measured ({exc}); batches are "
                                    "not padded, so a stream's outputs may differ with the streams beside it: set "
                                    "min_batch_rows to a count of rows")
            return 1, " (auto: not measured)"

    @staticmethod
    def auto_complete_config(auto_complete_model_config, pb):
        return auto_complete_model_config

    # -- requests -----------------------------------------------------------------------
    def execute(self, requests) -> None:
        """Each request becomes a stream handed to the iteration loop; one that cannot be read
        is answered at once with its error, as its only (final) response."""
        now = time.monotonic()
        streams: List[Stream] = []
        for request, item in zip(requests, self.reader.read_all(requests)):
            sender = request.get_response_sender()
            try:
                if isinstance(item, Exception):
                    raise item
                streams.append(self._stream(request, sender, item, now))
            except RequestError as exc:
                self._send(sender, self.responses.build(exc), final=True)
            except Exception as exc:  # a defect of latte's own answers this request alone, in one line
                self.pb.Logger.log_error(f"latte: {self.name}: could not read a request: {type(exc).__name__}: {exc}\n"
                                         f"{traceback.format_exc()}")
                self._send(sender, self.responses.build(RuntimeError(f"model {self.name!r} could not read the "
                                                                     "request; the server log says why")), final=True)
        if streams:
            self.runner.submit(streams)
        return None

    def _stream(self, request, sender, item, now: float) -> Stream:
        controls = read_controls(item.inputs, item.parameters, self.options.max_tokens, self._declares_stream,
                                 item.timeout_us)
        missing = [name for name in self.definition.start_inputs if name not in item.inputs]
        if missing:
            raise RequestError(f"{self.definition.start.path.name} reads input {missing[0]!r}, which the request "
                               "does not carry")
        inputs = {name: item.inputs[name] for name in self.definition.start_inputs}
        prompt = b""
        if self._prompt is not None and self._prompt in item.inputs:
            raw = item.inputs[self._prompt].reshape(-1)
            prompt = bytes(raw[0]) if raw.size else b""
        return Stream(inputs, controls, now, sender=sender, request=request, text=self._text, prompt=prompt)

    # -- responses ----------------------------------------------------------------------
    def _send_loop(self, outbox) -> None:
        while True:
            emissions = outbox.get()
            if emissions is None:
                return
            self._send_all(emissions, outbox)

    def _send_all(self, emissions, outbox) -> None:
        """Each emission in order; a newcomer's first output posted meanwhile goes before the
        rest (outbox.py says why that keeps every stream's order)."""
        for stream, outcome, final in emissions:
            first = outbox.openings()
            if first:
                self._send_all(first, outbox)
            self._send_guarded(stream, outcome, final)

    def _send_guarded(self, stream: Stream, outcome, final: bool) -> None:
        """One emission sent, by a sender or by the loop; a failure of latte's own is logged
        and ends that stream alone, with a final response still sent."""
        try:
            self._send_one(stream, outcome, final)
        except Exception as exc:
            self.pb.Logger.log_error(f"latte: {self.name}: could not send a response: {type(exc).__name__}: {exc}\n"
                                     f"{traceback.format_exc()}")
            failure = ModelError(f"model {self.name!r} could not send its response; the server log says why")
            stream.cancelled = failure  # the loop ends it with this error at its next iteration
            if final:
                try:
                    response = self.responses.error(failure)
                except Exception:
                    response = None
                self._send(stream.sender, response, final=True)

    def _prepare(self, outcome):
        """The response the loop makes of an outcome (runner.py `_ready`); raises when an output
        cannot be carried, which ends the stream there."""
        if isinstance(outcome, Exception):
            return self.responses.error(outcome)
        return self.responses.success(outcome)

    def _send_one(self, stream: Stream, outcome, final: bool) -> None:
        output = False
        if outcome is None:  # the end: the final flag, alone or with what the stream asked to close with
            closing = stream.closing()
            response = None if closing is None else self.responses.build(closing)
        elif type(outcome) is Ready:
            response, output = outcome.response, outcome.output
        else:
            output = not isinstance(outcome, Exception)
            try:
                response = self.responses.build(outcome)
            except Exception as exc:  # not even its error could be made: the stream ends
                self.pb.Logger.log_error(f"latte: {self.name}: could not make a response: {exc}")
                response, final, stream.cancelled, output = None, True, True, False
        if self._send(stream.sender, response, final, stream=stream) and output:
            self._sent_output(stream)

    def _sent_output(self, stream: Stream) -> None:
        """Time to the stream's first output, or since its previous one, for the histograms.
        A stream's outputs all go through one sender (its first, maybe the loop, before any
        other is posted), so its `sent_at` has one writer at a time."""
        now = time.monotonic()
        last = stream.sent_at
        self.metrics.stream_output(last is None, now - (stream.arrival if last is None else last))
        stream.sent_at = now

    def _send(self, sender, response, final: bool, stream: Optional[Stream] = None) -> bool:
        """Whether the response went out."""
        flags = self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        try:
            if response is None:
                sender.send(flags=flags)
            else:
                sender.send(response, flags=flags)
        except Exception as exc:  # the client is gone: the stream leaves at the next iteration
            if stream is not None:
                stream.cancelled = True
            log = getattr(self.pb.Logger, "log_verbose", self.pb.Logger.log_info)
            log(f"latte: {self.name}: could not send a response: {exc}")
            return False
        return True

    def figures(self) -> dict:
        """The loop's running totals, what the live streams hold, and the streams waiting."""
        return {**self.runner.figures, **self.runner.held, "iterations": self.runner.iterations,
                "waiting": self.runner.scheduler.waiting}

    def _refresh_gauges(self) -> None:
        self.metrics.streams(self.figures())
        # Each start and step batch, as a served model's batches are counted (its rows, padding
        # included, and the time inside the model).
        for runner in (self.engine.starts, self.engine.steps):
            for record in runner.take_records():
                self.metrics.batch(record.rows, record.model_seconds, record.failed)
        # Each graph's per-step times, by program (reading them also folds what each batch recorded).
        self.metrics.steps({f"{program}.{step}": figures
                            for program, graph in (("start", self.start_graph), ("step", self.step_graph))
                            for step, figures in graph.step_figures().items()})
        self.metrics.arena(self.arena.stats())
        self.metrics.resident_memory(rss_bytes(os.getpid()))

    # -- unloading ----------------------------------------------------------------------
    def _join_senders(self) -> None:
        for sender in self._senders:
            sender.join(5.0)

    def finalize(self) -> None:
        self._close()

    def _close(self) -> None:
        stop_parts(self.pb, self.name, (("metrics publisher", self.publisher and self.publisher.close),
                                        ("iteration loop", self.runner and self.runner.close),
                                        ("response senders", self._senders and self._join_senders),
                                        ("start graph", self.start_graph and self.start_graph.close),
                                        ("step graph", self.step_graph and self.step_graph.close)))
        memory_resource.release(self.arena.empty)
