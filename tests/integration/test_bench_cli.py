"""`latte bench --url` against a running server writes results.json and a self-contained report."""

import json
import subprocess
import sys


def test_latte_bench_measures_a_running_server_and_writes_its_report(server, tmp_path):
    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, "-m", "latte.cli", "bench", "--url", server.http_url, "--grpc-url", server.grpc_url,
         "--metrics-url", server.metrics_url, "--model", "sequence_onnx", "--concurrency", "1,2",
         "--request-rates", "40", "--lengths", "zipf:buckets=4-16-64,s=1.1", "--samples", "32",
         "--measurement-ms", "800", "--max-trials", "4", "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((out / "sequence_onnx" / "results.json").read_text())
    assert [(p["kind"], p["level"]) for p in results["points"]] == [
        ("concurrency", 1), ("concurrency", 2), ("request_rate", 40.0)]
    for point in results["points"]:
        assert point["throughput"] > 0 and 0 < point["p50_ms"] <= point["p99_ms"]
        assert point["server"]["inference_count"] > 0
        assert sum(point["server"]["batch_size_counts"].values()) == point["server"]["execution_count"]
    assert set(results["lengths"]["drawn"]) <= {4, 16, 64} and len(set(results["lengths"]["drawn"])) > 1
    # The server was found from its port: memory of it and of its stubs was sampled.
    assert results["server"]["pid"] == server.process.pid
    assert results["samples"][0]["rss"]["tritonserver"] > 0
    assert any(k.startswith("stub:") and k.endswith("sequence_onnx_0_0") for k in results["samples"][0]["rss"])
    assert any(k.startswith("nv_inference_count") for k in results["samples"][-1]["metrics"])
    html = (out / "sequence_onnx" / "report.html").read_text()
    assert html.index("Peak throughput") < html.index("<img") and "data:image/png;base64," in html
