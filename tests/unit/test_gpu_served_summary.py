"""What the page makes of a served-memory run (benchmarks/gpu_served.py): the arena's held memory
and P99 against the caching allocator's, answers against fp32, and a contender that did not load."""

import pytest

import bench_scripts

MIB = 1 << 20


@pytest.fixture(scope="module")
def gpu_served():
    return bench_scripts.load("gpu_served")


def window(p99, peak_held, peak_live=300 * MIB, failures=0.0):
    return {"p50_ms": p99 / 2, "p99_ms": p99, "throughput": 2000.0,
            "memory": {"peak_held": peak_held, "peak_live": peak_live, "failures": failures, "smi_mib": 1100.0}}


def run(arena_held, arena_p99=5.0, load_errors=None):
    windows = {"caching": [window(6.0, 380 * MIB), window(6.0, 380 * MIB)],
               "arena": [window(arena_p99, arena_held), window(arena_p99, arena_held)]}
    roles = list(windows)
    if load_errors:
        for role in load_errors:
            windows.pop(role, None)
        roles = list(windows)
    return {"device": "a GPU", "kind": "KIND_GPU", "concurrency": 8, "lengths": "lognormal", "window_ms": 1000,
            "windows": windows, "answer_errors": {role: 1e-7 for role in roles},
            "failed_requests": {role: 0 for role in roles}, "load_errors": load_errors or {}}


# Each target's verdict from the run that decides it (the caching allocator: P99 6.0 ms, 380 MiB held).
VERDICTS = [
    (run(190 * MIB), "arena: peak held ≤ 0.5x the caching allocator's", "0.50x", "yes"),
    (run(297.6 * MIB), "arena: peak held ≤ 0.5x the caching allocator's", "0.78x", "no"),
    (run(200 * MIB, arena_p99=6.6), "arena: P99 ≤ 1.0x the caching allocator's", None, "no"),
    (run(200 * MIB, arena_p99=6.6), "arena: no request fails and no allocation is refused", None, "yes"),
    (run(200 * MIB, arena_p99=6.6), "arena: answers within 0.0001 relative L2 of fp32 on the CPU", None, "yes"),
]


@pytest.mark.parametrize("result,target,measured,met", VERDICTS)
def test_each_target_is_judged_on_its_figure(gpu_served, result, target, measured, met):
    found = next(t for t in gpu_served.summarize(result)["targets"] if t.target.split(" (")[0] == target)
    assert found.met == met
    if measured is not None:
        assert found.measured == measured


def test_a_contender_that_did_not_load_is_a_missed_target_with_its_reason(gpu_served):
    summary = gpu_served.summarize(run(0, load_errors={"arena": "device_allocator arena: no CUDA"}))
    missed = next(t for t in summary["targets"] if t.target == "arena: loads and serves under the server")
    assert (missed.met, missed.why) == ("no", "device_allocator arena: no CUDA")


def test_p99_is_the_median_of_each_windows_ratio_not_the_ratio_of_medians(gpu_served):
    # The machine slows in the second window for both; within each window the arena is ahead.
    r = run(200 * MIB)
    r["windows"]["caching"] = [window(6.25, 380 * MIB), window(6.81, 380 * MIB), window(8.29, 380 * MIB)]
    r["windows"]["arena"] = [window(5.82, 200 * MIB), window(8.42, 200 * MIB), window(7.61, 200 * MIB)]
    assert gpu_served.window_ratios(r, "arena") == pytest.approx([0.931, 1.236, 0.918], abs=1e-3)
    summary = gpu_served.summarize(r)
    p99 = next(t for t in summary["targets"] if t.target.startswith("arena: P99"))
    assert p99.target == "arena: P99 ≤ 1.0x the caching allocator's (median of the windows' ratios)"
    assert (p99.measured, p99.met) == ("0.93x (windows 0.93, 1.24, 0.92; ratio of medians 1.12x)", "yes")
    arena_row = next(row for row in summary["tables"][0].rows if row[0] == "arena")
    assert arena_row[9] == "0.93x"
