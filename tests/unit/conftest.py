import pytest


@pytest.fixture(scope="session")
def sequence_pipeline(tmp_path_factory):
    """The example pipeline's files (real exported encoder) with a fixed synthetic profile."""
    from latte.examples.pipeline import write_pipeline
    from latte.generator.profile_data import Point, Profile

    directory = tmp_path_factory.mktemp("pipeline")
    points = []
    # Latency grows with length: 16 and 32 are within 15% of each other, 64 and 128 are not.
    for length, scale in ((16, 1.0), (32, 1.05), (64, 1.6), (128, 3.0)):
        for batch, ms in ((1, 0.5), (2, 0.6), (4, 0.8), (8, 1.2), (16, 2.0), (32, 4.0)):
            points.append(Point(batch, length, ms * scale, ms * scale, ms * scale * 1.2, batch * length * 4096))
    profile = Profile("sequence/model.onnx", "onnx", "cpu", 1,
                      [{"name": "tokens", "data_type": "TYPE_INT64", "dims": [-1]}],
                      [{"name": "embedding", "data_type": "TYPE_FP32", "dims": [32]}], points)
    profile.save(directory / "encoder.json")
    # The fused embed_text's own profile: its whole graph per batch of texts (fixed shapes).
    fused = Profile("embed_text/1/graph.json", "graph", "cpu", 1,
                    [{"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1]}],
                    [{"name": "EMBEDDING", "data_type": "TYPE_FP32", "dims": [32]},
                     {"name": "NORM", "data_type": "TYPE_FP32", "dims": [1]}],
                    [Point(batch, None, ms, ms, ms * 1.2, batch * 8192)
                     for batch, ms in ((1, 0.08), (2, 0.1), (4, 0.14), (8, 0.22), (16, 0.4), (32, 0.75))])
    fused.save(directory / "embed_text.json")
    write_pipeline(directory, slo_ms=20, cores=2,
                   profiles={"encoder": directory / "encoder.json", "embed_text": directory / "embed_text.json"})
    return directory


def flat_profile(path, model_file, inputs, outputs, lengths=(None,)):
    """A synthetic profile (latency grows with batch and length) that spares profiling a model."""
    from latte.generator.profile_data import Point, Profile

    points = []
    for length in lengths:
        scale = 1.0 if length is None else length / 32
        for batch, ms in ((1, 0.3), (2, 0.35), (4, 0.45), (8, 0.7), (16, 1.2), (32, 2.2)):
            points.append(Point(batch, length, ms * scale, ms * scale, ms * scale * 1.2, batch * 4096))
    Profile(model_file, "onnx", "cpu", 1, inputs, outputs, points).save(path)
    return path


@pytest.fixture(scope="session")
def fused_pipelines(tmp_path_factory):
    """Each example pipeline generated and fused, with synthetic profiles: name -> (files, repo)."""
    from latte.examples.pipeline import write_pipeline
    from latte.generator.generate import generate

    fp32 = lambda name, *dims: {"name": name, "data_type": "TYPE_FP32", "dims": list(dims)}
    built = {}
    for name in ("text", "image", "branching"):
        files = tmp_path_factory.mktemp(f"pipeline-{name}")
        profiles = {
            "encoder": flat_profile(files / "encoder.json", "sequence/model.onnx",
                                    [{"name": "tokens", "data_type": "TYPE_INT64", "dims": [-1]}],
                                    [fp32("embedding", 32)], lengths=(16, 32, 64, 128)),
            "cnn": flat_profile(files / "cnn.json", "cnn/model.onnx", [fp32("image", 3, 32, 32)], [fp32("logits", 10)]),
            "topics": flat_profile(files / "topics.json", "topics/model.onnx", [fp32("embedding", 32)],
                                   [fp32("topics", 4)]),
        }
        spec = write_pipeline(files, slo_ms=50, cores=2, name=name, profiles=profiles)
        generate(spec, files / "repo")
        built[name] = (files, files / "repo")
    return built


@pytest.fixture
def example_engine(example_repo):
    """Builds an example model's engine as the served model would: `example_engine(model)`
    gives (spec, engine); `bucketed=True` pads ragged inputs to the config's shape buckets,
    other keywords override config parameters."""
    from example_models import example_spec
    from latte.backend.buckets import BucketPlan
    from latte.backend.engine import BatchEngine
    from latte.backend.graph.graph import load_model

    def build(model, bucketed=False, **parameters):
        spec = example_spec(example_repo, model, **parameters)
        graph, _ = load_model(spec)
        engine = BatchEngine(spec, graph)
        if not bucketed:
            engine.planner.buckets = None
        return spec, engine

    return build
