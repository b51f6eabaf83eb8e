"""End to end: spec -> profile -> derived, generated ensemble -> real tritonserver -> same outputs as in-process."""

import numpy as np
import pytest

pytestmark = pytest.mark.integration

TEXTS = [b"the quick brown fox jumps over the lazy dog", b"hello", b"latte serves ragged batches of text"]


def test_generated_ensemble_matches_the_pipeline_in_process(tmp_path):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    from latte.examples.pipeline import run_in_process, write_pipeline
    from latte.generator.generate import generate
    from latte.generator.profile_data import Profile
    from latte.generator.verify import verify
    from latte.triton import TritonServer

    pipe = tmp_path / "pipe"
    spec = write_pipeline(pipe, slo_ms=50, cores=2)
    repo = tmp_path / "repo"
    plans = generate(spec, repo)
    encoder = next(p for p in plans if p.name == "encoder")
    # Profiled during generate (the spec names no profile), at several lengths of the ragged input.
    profile = Profile.load(pipe / "profiles" / "encoder.json")
    assert len(profile.buckets()) > 1
    assert encoder.derivation.worst_case_ms <= 50
    assert "bucket_edges" in encoder.context["parameters"]

    with TritonServer(repo) as server:
        http = httpclient.InferenceServerClient(server.http_url)
        # One request carrying a batch of texts of different lengths.
        batch = np.array([[t] for t in TEXTS], dtype=object)
        inp = httpclient.InferInput("TEXT", list(batch.shape), "BYTES")
        inp.set_data_from_numpy(batch)
        result = http.infer("embed_text", [inp])
        expected = run_in_process(pipe, batch)
        np.testing.assert_allclose(result.as_numpy("EMBEDDING"), expected["EMBEDDING"], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(result.as_numpy("NORM"), expected["NORM"], rtol=1e-4, atol=1e-5)

        # Single-text requests in flight together: the encoder may batch them across requests.
        http_pool = httpclient.InferenceServerClient(server.http_url, concurrency=len(TEXTS))
        pending = []
        for text in TEXTS:
            one = np.array([[text]], dtype=object)
            request = httpclient.InferInput("TEXT", [1, 1], "BYTES")
            request.set_data_from_numpy(one)
            pending.append((one, http_pool.async_infer("embed_text", [request])))
        for one, future in pending:
            got = future.get_result().as_numpy("EMBEDDING")
            np.testing.assert_allclose(got, run_in_process(pipe, one)["EMBEDDING"], rtol=1e-4, atol=1e-5)
            assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)

        # gRPC reaches the same ensemble.
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        request = grpcclient.InferInput("TEXT", list(batch.shape), "BYTES")
        request.set_data_from_numpy(batch)
        np.testing.assert_allclose(grpc.infer("embed_text", [request]).as_numpy("EMBEDDING"),
                                   expected["EMBEDDING"], rtol=1e-4, atol=1e-5)

        # The loop closes: perf_analyzer at the ensemble's planned rate against the running server.
        from latte.generator.operating_point import read_operating_points

        report = verify(repo, "embed_text", 50, url=server.grpc_url, measurement_ms=1000)
        assert report.rate == read_operating_points(repo)["embed_text"].rate and report.concurrency is None
        assert report.throughput > 0 and 0 < report.p50_ms <= report.p99_ms
        assert report.slo_met == (report.p99_ms <= 50)
        assert (report.suggestion is None) == report.slo_met
        assert "embed_text: P99" in report.text()
