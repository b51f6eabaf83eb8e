"""Building Triton responses, and when to send them; `pb` is the stub's
triton_python_backend_utils, passed in."""

from __future__ import annotations

from typing import Callable, Dict

import numpy as np

from latte.backend.errors import error_class


class ResponseBuilder:
    def __init__(self, pb, output_names, as_given: bool = False) -> None:
        """`as_given`: a response carries the outputs its outcome holds, which are declared ones
        (a stream's: the additional outputs come only where asked for, and a response that ends
        a stream on its end token holds no output of the graphs); otherwise every output
        declared, each looked up."""
        self.pb = pb
        self.output_names = list(output_names)
        self._as_given = as_given

    # Responses are built with the output tensors passed by position: the stub's pybind11
    # constructor takes ~1.0 us that way against ~1.4 us by keyword (timed inside Triton 2.51's
    # stub), once per request.

    def success(self, outputs: Dict[str, np.ndarray]):
        # The stub's Tensor makes a non-contiguous array contiguous itself.
        Tensor = self.pb.Tensor
        if self._as_given:
            return self.pb.InferenceResponse([Tensor(name, array) for name, array in outputs.items()])
        return self.pb.InferenceResponse([Tensor(name, outputs[name]) for name in self.output_names])

    def error(self, exc: Exception):
        return self.pb.InferenceResponse(output_tensors=[], error=self.triton_error(exc))

    def triton_error(self, exc: Exception):
        """The stub's TritonError carrying the code errors.py gives the exception's class."""
        TritonError = self.pb.TritonError
        message = str(exc) or type(exc).__name__
        # Triton 2.51's stub has every code errors.py names; an older one that lacks one still
        # gets the error out, with TritonError's default code (INTERNAL).
        code = getattr(TritonError, error_class(exc).code, None)
        if code is None:
            return TritonError(message)
        return TritonError(message, code)

    def answer(self, answer) -> list:
        """The responses of one batch's requests (engine.BatchAnswer), in its order: each
        request's share of every output as views of the batch when it ran whole (its
        `member_rows` rows each), else each request's own outcome."""
        _, results, outputs, rows, _ = answer
        if results is not None:
            return self._outcomes(results)
        names = self.output_names
        if len(rows) == 1 and len(names) == 1:  # the batch is its one request's: the common call
            try:
                return [self.pb.InferenceResponse([self.pb.Tensor(names[0], outputs[names[0]])])]
            except Exception:  # an output Triton cannot carry
                return [self.build(outputs)]
        Tensor, InferenceResponse = self.pb.Tensor, self.pb.InferenceResponse
        if len(rows) == len(outputs[names[0]]):
            # One row each: numpy hands out the row views itself.
            columns = [outputs[name][:, None] for name in names]
        else:
            ends = np.cumsum(rows)
            columns = [[array[end - r:end] for r, end in zip(rows, ends)] for array in (outputs[n] for n in names)]
        try:
            if len(names) == 1:
                (name,) = names
                return [InferenceResponse([Tensor(name, view)]) for view in columns[0]]
            return [InferenceResponse([Tensor(name, view) for name, view in zip(names, views)])
                    for views in zip(*columns)]
        except Exception:  # an output Triton cannot carry: each request gets its own answer
            return [self.build(dict(zip(names, views))) for views in zip(*columns)]

    def _outcomes(self, outcomes) -> list:
        """The responses of requests answered each with its own outcome, in order."""
        for outcome in outcomes:
            if type(outcome) is not dict:
                return [self.build(outcome) for outcome in outcomes]
        Tensor, InferenceResponse = self.pb.Tensor, self.pb.InferenceResponse
        names = self.output_names
        try:
            if len(names) == 1:
                (name,) = names
                return [InferenceResponse([Tensor(name, outputs[name])]) for outputs in outcomes]
            return [InferenceResponse([Tensor(name, outputs[name]) for name in names])
                    for outputs in outcomes]
        except Exception:  # an output Triton cannot carry: each request gets its own answer
            return [self.build(outcome) for outcome in outcomes]

    def build(self, outcome):
        """The response for one outcome: its outputs, or its error."""
        if isinstance(outcome, Exception):
            return self.error(outcome)
        try:
            return self.success(outcome)
        except Exception as exc:  # an output Triton cannot carry fails this request alone
            return self.error(RuntimeError(f"could not build the response: {exc}"))


RESPOND_MODES = ("auto", "per_batch", "per_call")


class EarlyAnswers:
    """Whether the requests of a finished batch are answered now, through their response
    senders, or ride back in `execute`'s return value with the last batch's.

    Each send is a round trip between the model's process and the server (measured at
    ~0.3 ms of the stub's time on a busy 2-core box: more than a small model's batch), while
    the returned list is one message for all. Sending k finished requests early saves each
    of them the rest of the call (pending x request_s) and delays every pending request by
    k sends, a net gain of k x pending x (request_s - send_s): it pays when a request's model
    time exceeds a send's. `auto` sends early when it pays, or when the finished batch holds
    a higher priority than some request still to run (the client asked for it), using
    running estimates of both times. `per_batch` always sends early, `per_call` never.
    """

    def __init__(self, mode: str = "auto", send_s: float = 300e-6) -> None:
        if mode not in RESPOND_MODES:
            raise ValueError(f"respond must be one of {', '.join(RESPOND_MODES)}, got {mode!r}")
        self.mode = mode
        self.send_s = send_s     # running estimate of one send's wall time
        self.request_s = 0.0     # running estimate of model time per request

    def batch_done(self, requests: int, seconds: float) -> None:
        if requests > 0:
            self.request_s += 0.1 * (seconds / requests - self.request_s)

    def sent(self, sends: int, seconds: float) -> None:
        if sends > 0:
            self.send_s += 0.1 * (seconds / sends - self.send_s)

    def now(self, finished_priority: int, pending: int, pending_priority: Callable[[], int]) -> bool:
        """`pending` requests are still to run; `pending_priority()` is the lowest priority among them."""
        if pending == 0 or self.mode == "per_call":
            return False
        if finished_priority > 0 and finished_priority > pending_priority():
            return True
        return self.pays()

    def pays(self) -> bool:
        """Whether requests of one priority, finished while others still run, are sent now."""
        return self.mode == "per_batch" or (self.mode == "auto" and self.request_s > self.send_s)
