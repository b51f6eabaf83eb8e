"""Each of latte's errors says which Triton status code its client gets and how it is
counted; docs/backend.md's error table says the same."""

import re
from pathlib import Path

import pytest

from latte.backend import errors
from latte.backend.errors import (ConfigError, DeadlineExceeded, LatteError, ModelError, OutOfMemory, Overloaded,
                                  RequestCancelled, RequestError, RuntimeLoadError, device_out_of_memory, error_class)
from latte.backend.metrics import outcome_label

DOCS = Path(__file__).resolve().parents[2] / "docs" / "backend.md"


@pytest.mark.parametrize("exc, code, label", [
    (RequestError("input 'x': expected shape [-1, 16], got [1, 15]"), "INVALID_ARG", "bad_request"),
    (Overloaded("overloaded: the request was not admitted (queue_full)"), "UNAVAILABLE", "overloaded"),
    (DeadlineExceeded("timed out: waited 12.0 ms, longer than timeout_ms=10"), "UNAVAILABLE", "timeout"),
    (OutOfMemory("the arena cannot hold 393216 bytes"), "UNAVAILABLE", "out_of_memory"),
    (RequestCancelled("the client cancelled this request before it ran"), "CANCELLED", "cancelled"),
    (ModelError("model 'm' failed: ValueError: negative input"), "INTERNAL", "model_error"),
    (ConfigError("parameters['lanes'] must be an integer"), "INVALID_ARG", "config_error"),
    (RuntimeLoadError("unknown runtime 'tflite'"), "INVALID_ARG", "config_error"),
])
def test_each_error_carries_its_triton_code_and_its_metric_label(exc, code, label):
    assert (error_class(exc).code, error_class(exc).label) == (code, label)
    assert outcome_label(exc) == label


@pytest.mark.parametrize("exc, code, label", [
    (MemoryError("std::bad_alloc"), "UNAVAILABLE", "out_of_memory"),   # what the arena raises
    (KeyError("logits"), "INTERNAL", "error"),
])
def test_an_exception_latte_did_not_raise_is_answered_by_what_it_is(exc, code, label):
    assert (error_class(exc).code, outcome_label(exc)) == (code, label)


def test_a_success_is_counted_as_one():
    assert outcome_label(None) == "success"


def test_the_errors_keep_the_builtin_types_callers_catch():
    assert issubclass(RequestError, ValueError) and issubclass(ConfigError, ValueError)
    assert issubclass(OutOfMemory, MemoryError)
    assert issubclass(RuntimeLoadError, RuntimeError) and issubclass(RuntimeLoadError, ConfigError)
    assert all(issubclass(cls, LatteError) for cls in (Overloaded, DeadlineExceeded, RequestCancelled, ModelError))


def test_a_model_error_keeps_the_whole_text_for_the_log():
    error = ModelError("model 'm' failed: RuntimeError: boom", detail="RuntimeError: Traceback ...\nboom")
    assert str(error) == "model 'm' failed: RuntimeError: boom" and error.detail.endswith("boom")


def _documented_rows():
    """(error names, code, outcome label) per row of the "Errors" table in docs/backend.md."""
    section = DOCS.read_text().split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| `")]
    return [(re.findall(r"`(\w+)`", cells[0]), cells[2].strip(" `"), cells[5].strip(" `")) for cells in rows]


def test_the_documented_error_table_matches_the_code():
    documented = {}
    for names, code, label in _documented_rows():
        for name in names:
            documented[name] = (code, label)
    classes = {name: cls for name, cls in vars(errors).items()
               if isinstance(cls, type) and issubclass(cls, LatteError) and cls is not LatteError}
    assert set(documented) == set(classes)
    for name, cls in classes.items():
        assert documented[name] == (cls.code, cls.label), name


def test_a_device_running_out_of_memory_is_told_from_a_model_error():
    class OutOfMemoryError(RuntimeError):  # torch.OutOfMemoryError's name, without torch
        pass

    scripted = RuntimeError("The following operation failed in the TorchScript interpreter.\nTraceback of "
                            "TorchScript ...\nRuntimeError: CUDA out of memory: latte device arena on device 0: "
                            "BuddyArena: cannot allocate 1048576 bytes: ...")
    assert device_out_of_memory(OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB"))
    assert device_out_of_memory(scripted)
    assert not device_out_of_memory(RuntimeError("shape '[2, 3]' is invalid for input of size 5"))
    assert not device_out_of_memory(ValueError("CUDA out of memory"))  # not what a runtime raises
    # A model's own error that quotes such a text stays the model's error.
    assert not device_out_of_memory(ModelError("model 'm' failed: ValueError: CUDA out of memory"))
