"""`latte profile` on the real example models, with latte's own runtimes."""

import json

import pytest

from latte.cli import main
from latte.generator.profile import ProfileOptions, profile_model
from latte.generator.shapes import ShapeError, parse_input_flag, resolve_shapes

FAST = dict(min_iterations=3, max_iterations=10, min_seconds=0.0, warmup=1)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from latte.examples import EXAMPLES, export

    root = tmp_path_factory.mktemp("models")
    return {name: export(EXAMPLES[name], root / name) for name in ("mlp", "sequence")}


def test_onnx_shapes_come_from_the_graph(exported):
    shapes = resolve_shapes(exported["sequence"]["onnx"])
    assert shapes.source == "the ONNX graph"
    assert shapes.batched and shapes.variable
    assert shapes.inputs == [{"name": "tokens", "data_type": "TYPE_INT64", "dims": [-1], "ragged": True}]
    assert shapes.outputs[0]["name"] == "embedding"


def test_input_flags_and_their_errors():
    assert parse_input_flag("image:FP32:3,32,32") == {"name": "image", "data_type": "TYPE_FP32", "dims": [3, 32, 32]}
    assert parse_input_flag("tokens:TYPE_INT64:-1")["dims"] == [-1]
    with pytest.raises(ShapeError, match="expected name:dtype:dims"):
        parse_input_flag("image:FP32")
    with pytest.raises(ShapeError, match="unknown data type 'FLOAT'"):
        parse_input_flag("image:FLOAT:3")
    with pytest.raises(ShapeError, match="dims must be positive or -1"):
        parse_input_flag("image:FP32:0")


def test_torchscript_needs_its_inputs_named(exported):
    with pytest.raises(ShapeError, match="pass --input name:dtype:dims"):
        resolve_shapes(exported["mlp"]["torchscript"])


def test_config_beside_the_file_gives_the_shapes(exported, tmp_path):
    from latte.examples import EXAMPLES, model_context
    from latte.generator.model_folder import write_model

    model_dir = write_model(tmp_path, model_context(EXAMPLES["mlp"], "torchscript", "model.pt"),
                            {"model.pt": exported["mlp"]["torchscript"]})
    shapes = resolve_shapes(model_dir / "1" / "model.pt")
    assert shapes.source.endswith("config.pbtxt")
    assert shapes.inputs[0]["name"] == "features" and shapes.inputs[0]["dims"] == [16]


def test_fixed_shape_sweep_doubles_batch_and_records_latency(exported):
    profile = profile_model(exported["mlp"]["onnx"], ProfileOptions(max_batch_size=16, **FAST))
    sizes = [p.batch_size for p in profile.points]
    assert sizes[0] == 1 and all(b == 2 * a for a, b in zip(sizes, sizes[1:]))
    assert all(p.length is None and 0 < p.p50_ms <= p.p99_ms for p in profile.points)
    assert all(p.peak_bytes >= p.batch_size * 16 * 4 for p in profile.points)   # at least the input itself
    assert profile.outputs == [{"name": "logits", "data_type": "TYPE_FP32", "dims": [8]}]
    assert profile.stop_reason["fixed"]


def test_ragged_input_is_measured_per_length_bucket(exported):
    opts = ProfileOptions(max_batch_size=4, lengths=[8, 32], **FAST)
    profile = profile_model(exported["sequence"]["onnx"], opts)
    assert profile.buckets() == [8, 32]
    assert {p.length for p in profile.curve(32)} == {32}


def test_torchscript_with_input_flag(exported):
    opts = ProfileOptions(inputs=[parse_input_flag("x:FP32:16")], max_batch_size=2, intra_op_threads=1, **FAST)
    profile = profile_model(exported["mlp"]["torchscript"], opts)
    assert profile.runtime == "torchscript"
    assert profile.outputs[0]["dims"] == [8]


def test_memory_limit_stops_the_sweep(exported):
    opts = ProfileOptions(max_batch_size=64, memory_limit_bytes=1, **FAST)
    profile = profile_model(exported["mlp"]["onnx"], opts)
    assert len(profile.points) == 1
    assert profile.stop_reason["fixed"].startswith("memory")


def test_predicted_next_latency_carries_the_last_doublings_growth_on():
    from latte.generator.profile_data import Point
    from latte.generator.profile import predicted_next_ms

    def at(batch, ms):
        return Point(batch_size=batch, length=None, mean_ms=ms, p50_ms=ms, p99_ms=ms, peak_bytes=0)

    assert predicted_next_ms([at(1, 4.0)]) is None
    assert predicted_next_ms([at(32, 15.0), at(64, 30.0)]) == pytest.approx(60.0)
    # A curve that has not started to grow is not predicted to shrink.
    assert predicted_next_ms([at(1, 5.0), at(2, 4.0)]) == pytest.approx(4.0)


class ModelClock:
    """The profiler's clock, advanced only by the model's calls. A cost model that sleeps
    oversleeps by however long a busy machine keeps the thread waiting, which moves the batch
    where a sweep stops; on this clock each call costs exactly what the model says."""

    def __init__(self):
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def spend(self, ms: float) -> None:
        self.now += ms / 1000.0


@pytest.fixture
def clock(monkeypatch):
    import types

    from latte.generator import profile

    clock = ModelClock()
    monkeypatch.setattr(profile, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    return clock


def test_a_sweep_skips_the_batch_that_would_pass_the_ceiling(exported, clock):
    import numpy as np

    from latte.generator.profile import _sweep_bucket

    ran = []

    def run(feed):   # 3 ms a row: batch 4 takes 12 ms, so batch 8 (about 24 ms) cannot fit 20 ms
        batch = len(feed["features"])
        ran.append(batch)
        clock.spend(3.0 * batch)

    shapes = resolve_shapes(exported["mlp"]["onnx"])
    opts = ProfileOptions(max_batch_size=64, max_latency_ms=20.0, **FAST)
    points, reason = _sweep_bucket(run, shapes, None, opts, 1 << 34, np.random.default_rng(0), lambda n: None)
    assert [p.batch_size for p in points] == [1, 2, 4]
    assert 8 not in ran
    assert reason == "latency: batch 8 would take at least 24 ms, over the 20 ms ceiling"


def test_with_an_slo_the_longest_bucket_is_swept_past_its_plateau_to_the_ceiling(exported, clock):
    import numpy as np

    from latte.generator.profile import _sweep_bucket

    def run(feed):   # a row costs a little more in every bigger batch: throughput falls from the start
        clock.spend(len(feed["features"]) ** 1.15)

    shapes = resolve_shapes(exported["mlp"]["onnx"])
    sweep = dict(shapes=shapes, length=None, memory_limit=1 << 34, advance=lambda n: None)
    opts = ProfileOptions(max_batch_size=256, **FAST)
    points, reason = _sweep_bucket(run, opts=opts, rng=np.random.default_rng(0), **sweep)
    assert [p.batch_size for p in points] == [1, 2, 4] and reason.startswith("throughput: no gain")

    opts = ProfileOptions(max_batch_size=256, slo_ms=100.0, **FAST)
    assert opts.ceiling_ms == 50.0
    points, reason = _sweep_bucket(run, opts=opts, rng=np.random.default_rng(0), to_ceiling=True, **sweep)
    assert [p.batch_size for p in points] == [1, 2, 4, 8, 16]
    assert reason == "latency: batch 32 would take at least 54 ms, over the 50 ms ceiling"


def test_the_profile_keeps_its_ceiling_and_knows_which_slos_it_covers(exported, tmp_path):
    from latte.generator.profile_data import Profile, latency_ceiling_ms

    profile = profile_model(exported["mlp"]["onnx"], ProfileOptions(max_batch_size=2, max_latency_ms=25.0, **FAST))
    kept = Profile.load(profile.save(tmp_path / "profile.json"))
    assert kept.max_latency_ms == 25.0 == latency_ceiling_ms(50.0)
    assert kept.covers_slo(50.0) and kept.covers_slo(20.0)
    assert not kept.covers_slo(60.0)
    older = json.loads((tmp_path / "profile.json").read_text())
    del older["max_latency_ms"]
    assert Profile.from_json(older).covers_slo(1e6)   # profiles without a ceiling were swept to 2 s a call


def test_cli_writes_profile_json_and_plot(exported, tmp_path, capsys):
    # Without a server: the derivation then assumes the default per-batch serving cost and says so.
    code = main(["profile", str(exported["mlp"]["onnx"]), "-o", str(tmp_path), "--max-batch-size", "4",
                 "--min-seconds", "0", "--slo-ms", "50", "--no-calibrate"])
    assert code == 0
    data = json.loads((tmp_path / "profile.json").read_text())
    assert [p["batch_size"] for p in data["points"]] == [1, 2, 4]
    assert data["serving"] is None
    assert data["max_latency_ms"] == 25.0     # half of --slo-ms: no slower batch can fit it
    assert (tmp_path / "profile.png").read_bytes()[:4] == b"\x89PNG"
    out = capsys.readouterr().out
    assert "max_batch_size" in out and "serving cost 1 ms per batch (assumed: not calibrated" in out


def test_torch_export_shapes_come_from_the_program(tmp_path):
    import torch

    from latte.examples.models import SequenceEncoder

    module = SequenceEncoder().eval()
    batch, length = torch.export.Dim("batch", min=1, max=32), torch.export.Dim("length", min=2, max=128)
    program = torch.export.export(module, (torch.randint(1, 1000, (2, 9)),),
                                  dynamic_shapes={"tokens": {0: batch, 1: length}})
    torch.export.save(program, str(tmp_path / "model.pt2"))
    shapes = resolve_shapes(tmp_path / "model.pt2")
    assert shapes.source == "the torch.export program" and shapes.runtime == "torch_export"
    assert shapes.batched and shapes.variable
    assert shapes.inputs == [{"name": "tokens", "data_type": "TYPE_INT64", "dims": [-1], "ragged": True}]
    assert shapes.outputs == [{"name": "output0", "data_type": "TYPE_FP32", "dims": [32]}]


def test_a_profile_times_the_runtime_as_serving_calls_it(exported, monkeypatch):
    """Batches go through run_batch, the serving contract, as one-row requests each told its
    bucket's length: a graph's steps are timed as they run served, not through a side door."""
    import numpy as np

    import latte.backend.runtimes as runtimes
    from latte.backend.runtimes.base import Runtime

    seen = []

    class Recording(Runtime):
        def run_batch(self, batch):
            seen.append((batch.padded_length, set(batch.lengths), set(batch.member_rows), batch.rows))
            rows = len(batch.inputs["tokens"])
            return {"embedding": np.zeros((rows, 32), np.float32)}, None

    monkeypatch.setattr(runtimes, "load_runtime", lambda kind, path, inputs, outputs, *rest: Recording(inputs, outputs))
    profile = profile_model(exported["sequence"]["onnx"], ProfileOptions(max_batch_size=4, lengths=[8, 32], **FAST))
    assert profile.buckets() == [8, 32]
    assert {length for length, *_ in seen} == {8, 32}
    assert all(lengths == {length} and members == {1} for length, lengths, members, _ in seen)
    assert {rows for *_, rows in seen} == {1, 2, 4}


def test_a_missing_or_broken_profile_file_says_how_to_make_one(tmp_path):
    from latte.generator.profile_data import Profile, ProfileError
    from latte.generator.stream_profile import StreamProfile

    with pytest.raises(ProfileError, match=r"does not exist; create it with `latte profile MODEL_FILE`"):
        Profile.load(tmp_path / "none.json")
    with pytest.raises(ProfileError, match=r"does not exist; create it with `latte profile STREAM_JSON`"):
        StreamProfile.load(tmp_path / "none.json")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ProfileError, match=r"broken.json: not JSON"):
        Profile.load(tmp_path / "broken.json")
