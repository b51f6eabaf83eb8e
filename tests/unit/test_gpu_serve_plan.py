"""scripts/gpu_serve.sh --plan: before a lent machine's minutes are spent, whether TOTAL_S gives each
part what it asks, walked as the run will walk it (a part keeps its allowance for loads and 30 s
back, and gets what is left)."""

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PARTS = ("CHECKS_S", "CALL_S", "RANKER_S", "SEQUENCE_S", "MEMORY_S", "ALLOCATOR_S", "PIPELINE_S")


def plan(**settings):
    env = {k: v for k, v in os.environ.items() if k not in PARTS + ("TOTAL_S", "OUT")}
    env.update({part: "0" for part in PARTS})
    env.update({k: str(v) for k, v in settings.items()})
    done = subprocess.run(["bash", "scripts/gpu_serve.sh", "--plan"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=30)
    return done.returncode, done.stdout.splitlines()


def test_a_plan_that_holds_every_part_says_so_and_succeeds():
    code, lines = plan(RANKER_S=70, SEQUENCE_S=70, ALLOCATOR_S=200, TOTAL_S=540)
    assert code == 0
    assert lines == ["  ranker: 70 s of measuring (from about 16 s)",
                     "  sequence: 70 s of measuring (from about 91 s)",
                     "  allocator: 200 s of measuring (from about 166 s)",
                     "plan: about 366 s of TOTAL_S=540"]


def test_the_pipelines_allowance_for_its_generation_can_leave_it_out():
    # Served memory, then the pipeline, in 330 s: the pipeline's 170 s allowance does not fit after it.
    code, lines = plan(CHECKS_S=60, MEMORY_S=45, PIPELINE_S=140, TOTAL_S=330)
    assert code == 1
    assert lines[2].startswith("  pipeline: left out (at about 131 s, TOTAL_S=330 leaves it under 20 s")
    assert lines[-1].endswith("raise TOTAL_S or lower a part's seconds for every part to get what it asks")


def test_a_part_cut_short_is_named_with_what_it_gets():
    code, lines = plan(MEMORY_S=80, TOTAL_S=190)
    assert code == 1
    assert lines[0] == "  served-memory: 74 s of measuring, not 80 s (from about 16 s)"


def test_a_setting_that_is_not_a_number_is_refused_before_the_plan():
    code, lines = plan(RANKER_S="1m", TOTAL_S=540)
    assert code == 2
    assert lines == ["gpu_serve: RANKER_S must be a whole number of seconds (or windows), got 1m"]
