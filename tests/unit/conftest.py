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
    write_pipeline(directory, slo_ms=20, cores=2, profile=directory / "encoder.json")
    return directory
