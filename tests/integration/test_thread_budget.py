"""The thread budget on a real server: more single-threaded instances than cores load with a
warning and a metric; multi-threaded instances beyond the cores are refused at load."""

from __future__ import annotations

import time
import urllib.request

import pytest

from latte.backend.config import usable_cores
from latte.bench.prometheus_scrape import parse_prometheus, split_key
from latte.examples import EXAMPLES, model_context
from latte.generator.model_folder import write_model
from latte.triton import TritonServer

pytestmark = pytest.mark.integration


def _mlp(repo, example_repo, name, count, intra_op_threads):
    context = model_context(EXAMPLES["mlp"], "onnx", "model.onnx")
    context.update(name=name, instance_groups=[{"count": count, "kind": "KIND_CPU"}])
    context["parameters"] = {**context["parameters"], "intra_op_threads": str(intra_op_threads)}
    write_model(repo, context, {"model.onnx": example_repo / "mlp_onnx" / "1" / "model.onnx"})


def _thread_budget(metrics_url, model, timeout=15.0):
    """latte_thread_budget of `model` by state, once the model has published it."""
    deadline = time.monotonic() + timeout
    while True:
        values = parse_prometheus(urllib.request.urlopen(metrics_url).read().decode())
        # Every instance publishes the model's budget under its own `instance` label.
        found = {}
        for key, value in values.items():
            name, labels = split_key(key)
            if name == "latte_thread_budget" and labels.get("model") == model:
                found.setdefault(labels["state"], set()).add(value)
        found = {state: (found[state].pop() if len(found.get(state, ())) == 1 else found.get(state))
                 for state in ("within", "oversubscribed")}
        if any(v is not None for v in found.values()) or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def test_single_threaded_instances_beyond_the_cores_load_with_a_warning_multi_threaded_ones_do_not(
        example_repo, tmp_path):
    cores = usable_cores()
    repo = tmp_path / "repo"
    _mlp(repo, example_repo, "mlp_oversubscribed", cores + 1, intra_op_threads=1)
    _mlp(repo, example_repo, "mlp_multithreaded", cores, intra_op_threads=2)
    log = tmp_path / "tritonserver.log"
    with TritonServer(repo, log_path=log, keep_going=True) as server:
        failed = dict(server.failed_models())
        assert list(failed) == ["mlp_multithreaded"], failed
        assert (f"{cores} instance(s) x lanes=1 x intra_op_threads=2 = {2 * cores} threads exceed the "
                f"{cores} core(s) this server may use; multi-threaded instances must fit the cores") in failed[
                    "mlp_multithreaded"]
        assert f"= {cores + 1} threads on {cores} core(s); they take turns on the cores" in log.read_text()
        assert _thread_budget(server.metrics_url, "mlp_oversubscribed") == {"within": None,
                                                                          "oversubscribed": cores + 1}
