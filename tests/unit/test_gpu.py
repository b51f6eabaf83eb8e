"""The GPU paths on a CUDA device: KIND_GPU instances, one CUDA stream per lane, fp16 through the
accuracy gate, and PyTorch allocating from the arena process-wide. Every test here is marked
`gpu` and skips without a device (`make test-gpu`, docs/gpu.md)."""

import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from example_models import example_model, example_spec
from latte import _native
from latte.backend.config import ConfigError
from latte.backend.precision import load_at_precision
from latte.backend.standin_stub import InferenceRequest
from latte.backend.warmup import warmup_shapes
from latte.examples import EXAMPLES


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA device")]


def load(repo, model, kind="GPU", **parameters):
    return example_model(repo, model, kind=kind, **parameters)


def answers(model, feeds):
    requests = [InferenceRequest(feed) for feed in feeds]
    returned = model.execute(requests)
    # A batch finished early is answered through the request's sender; execute returns None for it.
    responses = [response if response is not None else request._sender.sent[-1][0]
                 for response, request in zip(returned, requests)]
    assert not any(r.has_error() for r in responses), [r.error().message() for r in responses if r.has_error()]
    return [r.output_tensors()[0].as_numpy() for r in responses]


@pytest.mark.parametrize("example", ["mlp", "sequence"])
def test_a_kind_gpu_instance_answers_as_the_cpu_instance_does(example_repo, example):
    rng = np.random.default_rng(11)
    feeds = [EXAMPLES[example].sample(rows, rng) for rows in (1, 3, 2, 1)]
    gpu, cpu = load(example_repo, f"{example}_torchscript"), load(example_repo, f"{example}_torchscript", kind="CPU")
    try:
        assert str(gpu.graph.device) == "cuda:0" and str(cpu.graph.device) == "cpu"
        for got, want in zip(answers(gpu, feeds), answers(cpu, feeds)):
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
    finally:
        gpu.finalize()
        cpu.finalize()


def test_each_lane_thread_runs_on_its_own_cuda_stream_and_the_loading_thread_on_the_default(example_repo):
    import torch

    model = load(example_repo, "mlp_torchscript")
    runtime = model.graph.steps[0].runtime
    seen, lock = [], threading.Lock()
    run = runtime._run_on_current_stream

    def recording(feed):
        with lock:
            seen.append((threading.get_ident(), torch.cuda.current_stream(runtime.device).cuda_stream))
        return run(feed)

    runtime._run_on_current_stream = recording
    feed = EXAMPLES["mlp"].sample(4, np.random.default_rng(2))
    want = runtime.run(feed)
    results = []
    threads = [threading.Thread(target=lambda: results.append(runtime.run(feed))) for _ in range(3)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        model.finalize()
    default = torch.cuda.default_stream(runtime.device).cuda_stream
    streams_by_thread = dict(seen)
    assert len(streams_by_thread) == 4                      # this thread and three others
    assert streams_by_thread.pop(threading.get_ident()) == default  # the thread that loaded it: no stream to enter
    assert len(set(streams_by_thread.values())) == 3        # the others: a stream each
    assert default not in streams_by_thread.values()
    assert torch.cuda.current_stream(runtime.device).cuda_stream == default
    for result in results:
        np.testing.assert_allclose(result["logits"], want["logits"], rtol=1e-5, atol=1e-6)


def test_a_gpu_model_with_two_lanes_answers_every_request(example_repo):
    rng = np.random.default_rng(5)
    feeds = [EXAMPLES["sequence"].sample(1, rng) for _ in range(24)]
    lanes, cpu = load(example_repo, "sequence_torchscript", lanes="2"), load(example_repo, "sequence_torchscript", kind="CPU")
    try:
        assert lanes.dispatcher is not None
        for got, want in zip(answers(lanes, feeds), answers(cpu, feeds)):
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
    finally:
        lanes.finalize()
        cpu.finalize()


def spec_on_gpu(repo, model, **parameters):
    return example_spec(repo, model, device="cuda:0", **parameters)


@pytest.mark.parametrize("example", ["mlp", "cnn", "sequence"])
def test_fp16_is_admitted_with_its_measured_accuracy(example_repo, example):
    spec = spec_on_gpu(example_repo, f"{example}_torchscript", precision="fp16", accuracy_tolerance="0.01")
    runtime, report = load_at_precision(spec, warmup_shapes(spec))
    try:
        assert runtime.half and str(runtime.device) == "cuda:0"
        assert report.precision == "fp16" and 0 < report.relative_l2 <= 0.01
        feed = EXAMPLES[example].sample(2, np.random.default_rng(8))
        (out,) = runtime.run(feed).values()
        assert out.dtype == np.float32 and np.all(np.isfinite(out))
    finally:
        runtime.close()


def test_fp16_past_the_tolerance_refuses_to_load(example_repo):
    spec = spec_on_gpu(example_repo, "mlp_torchscript", precision="fp16", accuracy_tolerance="1e-12")
    with pytest.raises(ConfigError, match=r"fp16 vs fp32: relative L2 error .* exceeds accuracy_tolerance=1e-12"):
        load_at_precision(spec, warmup_shapes(spec))


# Runs in its own interpreter: the allocator can be replaced only before CUDA is first used.
_PROCESS_WIDE_ARENA = r"""
import copy, json
import numpy as np, torch
from latte.memory import torch_arena_check, torch_arena_statistics, torch_pluggable_allocator

torch.cuda.memory.change_current_allocator(torch_pluggable_allocator())
rng = np.random.default_rng(20261125)
reference = torch.nn.TransformerEncoderLayer(128, 4, 256, batch_first=True).eval()
layer = copy.deepcopy(reference).cuda()
worst = 0.0
with torch.inference_mode():
    for step in range(300):
        length = int(min(512, max(1, rng.lognormal(4.0, 1.0))))
        x = torch.from_numpy(rng.standard_normal((2, length, 128), dtype=np.float32))
        got = layer(x.cuda()).cpu()
        if step % 50 == 0:
            want = reference(x)
            worst = max(worst, float((got - want).abs().max()))
torch.cuda.synchronize()
during = torch_arena_statistics(0)
del layer
torch.cuda.synchronize()
torch_arena_check(0)
print(json.dumps({"during": during, "after": torch_arena_statistics(0), "worst": worst}))
"""


@pytest.mark.skipif(not _native.cuda_device_memory_compiled(), reason="built without the CUDA toolkit")
def test_pytorch_allocates_from_the_arena_process_wide(tmp_path):
    arena_bytes = 1 << 30
    done = subprocess.run([sys.executable, "-c", _PROCESS_WIDE_ARENA], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "LATTE_CUDA_ARENA_BYTES": str(arena_bytes)})
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    during, after = figures["during"], figures["after"]
    assert during["capacity"] == arena_bytes
    assert during["allocations"] > 1000 and during["failures"] == 0
    assert 0 < during["peak_live"] <= during["peak_allocated"] < arena_bytes
    assert after["live"] < during["peak_live"]               # the weights went back to the arena
    assert figures["worst"] < 1e-3                           # answers match the CPU's


_SERVED_ALLOCATOR = r"""
import json, sys
import numpy as np
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from example_models import example_model
from latte.backend import device_memory
from latte.backend.standin_stub import InferenceRequest
from latte.examples import EXAMPLES

arena = {"device_allocator": "arena", "device_arena_bytes": str(256 << 20)}
settings = {"arena": arena, "arena_paged": {**arena, "arena_pages": "true"}}.get(sys.argv[2],
                                                                                {"device_allocator": sys.argv[2]})
model = example_model(Path(sys.argv[1]), "sequence_torchscript", kind="GPU", **settings)
rng = np.random.default_rng(3)
for rows in (1, 4, 2, 8):
    model.execute([InferenceRequest(EXAMPLES["sequence"].sample(rows, rng))])
states, failures = device_memory.figures(model.spec.serving)
print(json.dumps({**states, "failures": failures}))
model.finalize()
"""


@pytest.mark.parametrize("allocator", ["arena", "arena_paged", "expandable", "caching"])
def test_a_served_gpu_instance_holds_its_memory_with_the_chosen_allocator(example_repo, allocator):
    if allocator.startswith("arena") and not _native.cuda_device_memory_compiled():
        pytest.skip("built without the CUDA toolkit")
    here = str(Path(__file__).parent)
    done = subprocess.run([sys.executable, "-c", _SERVED_ALLOCATOR, str(example_repo), allocator, here],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert 0 < figures["peak_live"] <= figures["peak_held"]
    assert figures["live"] <= figures["held"]
    if allocator.startswith("arena"):
        assert figures["capacity"] == 256 << 20                  # device_arena_bytes, not 80 % of the device
        assert figures["failures"] == 0
        if allocator == "arena_paged":   # what it holds is pages taken as blocks touch them
            assert figures["held"] == figures["peak_held"] <= figures["capacity"]
    else:
        assert figures["failures"] is None and "capacity" not in figures
