"""A GPU model's allocations, recorded on an H200 (benchmarks/traces/, benchmarks/gpu_trace.py),
replayed into a paged host arena with the device's 2 MiB pages: what a device arena would hold
for them, checked without a device."""

import pytest

from bench_scripts import BENCHMARKS, load

gpu_trace = load("gpu_trace")


@pytest.mark.parametrize("model", ["sequence", "encoder"])
def test_a_paged_arena_holds_what_the_models_live_blocks_touch(model):
    figures = gpu_trace.replay(BENCHMARKS / "traces" / f"{model}.npz", page_mib=2, capacity_mib=16 << 10,
                               min_block=256)
    kept = gpu_trace.replay(BENCHMARKS / "traces" / f"{model}.npz", page_mib=2, capacity_mib=16 << 10,
                            min_block=256, idle_share=0)
    assert figures["failures"] == 0
    # Within half over the most pages in use, and those over the live bytes by the pages'
    # rounding; never more than keeping every idle page (1.30x on the sequence encoder, 1.48x
    # on the 6-layer one, which the share brings down to 1.18x).
    assert figures["held_over_live"] <= min(1.35, kept["held_over_live"])
    if model == "encoder":
        assert figures["held_over_live"] <= kept["held_over_live"] - 0.2
    # Evictions, each a wait for the device's kernels, are rare: a few dozen in 6,000 steps.
    assert 0 < figures["unmap_calls"] <= 50


def test_the_host_keeps_every_idle_page_unless_told():
    kept = gpu_trace.replay(BENCHMARKS / "traces" / "sequence.npz", page_mib=2, capacity_mib=16 << 10,
                            min_block=256, idle_share=0)
    assert kept["unmap_calls"] == 0 and kept["held_over_live"] > 1.25
