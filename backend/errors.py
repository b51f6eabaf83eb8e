"""Every error latte answers a request or a load with, and what each means to Triton.

Each class carries `code`, the name of the `pb_utils.TritonError` code its client gets (a
name, so this module needs no triton_python_backend_utils; responses.py turns it into the
stub's value), and `label`, its `outcome` on `latte_requests_total` (metrics.py). Nothing
else maps errors to codes or labels. The table in docs/backend.md ("Errors") lists them.
"""

from __future__ import annotations

from typing import Type

# The codes Triton 2.51's Python backend can send (pb_utils.TritonError): UNKNOWN, INTERNAL,
# NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED.
INVALID_ARG = "INVALID_ARG"
UNAVAILABLE = "UNAVAILABLE"
CANCELLED = "CANCELLED"
INTERNAL = "INTERNAL"


class LatteError(Exception):
    """Base of latte's errors; an exception of any other type is a fault latte did not
    foresee, answered as this class is (see `error_class`)."""

    code = INTERNAL
    label = "error"


# -- at load: the model fails to load, with the message in the server log ------------------

class ConfigError(LatteError, ValueError):
    """The model config cannot be served as written."""

    code = INVALID_ARG
    label = "config_error"


class RuntimeLoadError(ConfigError, RuntimeError):
    """The model file could not be loaded by its runtime."""


# -- per request: the client gets the code -------------------------------------------------

class RequestError(LatteError, ValueError):
    """This request cannot be served; the message says what was wrong and what was expected."""

    code = INVALID_ARG
    label = "bad_request"


class RequestCancelled(LatteError, RuntimeError):
    """The client gave up on the request before it ran."""

    code = CANCELLED
    label = "cancelled"


class Overloaded(LatteError, RuntimeError):
    """The scheduler could not keep the request: its queue was full, a more urgent request
    displaced it, or the model was shutting down. Not the request's fault: retry later."""

    code = UNAVAILABLE
    label = "overloaded"


class DeadlineExceeded(LatteError, RuntimeError):
    """The request waited longer than its timeout_ms before it could run."""

    # Triton has no DEADLINE_EXCEEDED code (neither TRITONSERVER_Error_Code nor the Python
    # backend's TritonError); UNAVAILABLE is what Triton's own queue answers a request whose
    # timeout expired with, so a client handles both timeouts alike.
    code = UNAVAILABLE
    label = "timeout"


class OutOfMemory(LatteError, MemoryError):
    """The arena cannot hold the batch right now; not the request's fault nor the model's."""

    code = UNAVAILABLE
    label = "out_of_memory"


class ModelError(LatteError, RuntimeError):
    """The model itself raised while running a request. The message is one line for the
    client; `detail` keeps the runtime's whole text (a TorchScript error carries its
    traceback) for the server log."""

    code = INTERNAL
    label = "model_error"

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


def device_out_of_memory(exc: BaseException) -> bool:
    """Whether a runtime's exception is its device running out of memory: torch's own
    OutOfMemoryError, or the RuntimeError latte's device arena raises through torch (its text
    starts "CUDA out of memory", inside a TorchScript traceback too). Like the host arena's
    MemoryError, that is not the request's fault: it is answered as OutOfMemory. Latte's own
    errors are worded already (a ModelError quotes whatever the model raised)."""
    if isinstance(exc, LatteError):
        return False
    return type(exc).__name__ == "OutOfMemoryError" or (
        isinstance(exc, RuntimeError) and "CUDA out of memory" in str(exc))


def error_class(exc: BaseException) -> Type[LatteError]:
    """The class whose `code` and `label` answer `exc`: its own for latte's errors. The arena
    (latte.memory) raises the builtin MemoryError, which the engine turns into OutOfMemory
    and which is answered as one wherever else it surfaces; anything else is answered as
    LatteError, an internal error."""
    if isinstance(exc, LatteError):
        return type(exc)
    if isinstance(exc, MemoryError):
        return OutOfMemory
    return LatteError
