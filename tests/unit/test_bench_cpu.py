"""CPU time per request, read from /proc: a busy process is charged, a sleeping one is not."""

import os
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

from latte.bench import cpu, procmem


def _busy(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def _busy_for_wall(seconds: float) -> None:
    """Busy for `seconds` of wall time, whatever share of a core the box gives this process."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@contextmanager
def _sleeper():
    """A process past its start-up (it said so), asleep until it is killed."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; print('asleep', flush=True); time.sleep(120)"],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert sleeper.stdout.readline() == "asleep\n"
        yield sleeper.pid
    finally:
        sleeper.kill()
        sleeper.wait()
        sleeper.stdout.close()


def test_a_process_is_charged_for_the_cpu_it_uses_not_the_time_it_sleeps():
    before = cpu.process_cpu_seconds(os.getpid())
    _busy(0.3)
    busy = cpu.process_cpu_seconds(os.getpid()) - before
    assert 0.25 <= busy <= 0.6

    with _sleeper() as pid:
        start = cpu.process_cpu_seconds(pid)
        time.sleep(0.3)
        assert cpu.process_cpu_seconds(pid) - start < 0.05


def test_a_child_is_charged_once_it_has_ended():
    before = cpu.children_cpu_seconds()
    subprocess.run([sys.executable, "-c",
                    "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"], check=True)
    assert cpu.children_cpu_seconds() - before >= 0.25


def test_cpu_per_request_is_split_by_process_and_summed():
    used = cpu.CpuSample(server=2.0, stubs=1.5, client=1.0).minus(cpu.CpuSample(server=1.0, stubs=0.5, client=0.5))
    figures = cpu.per_request_us(used, 1000)
    assert figures == {"server": 1000.0, "stub": 1000.0, "client": 500.0, "total": 2500.0}
    with pytest.raises(ValueError, match="no requests were served"):
        cpu.per_request_us(used, 0)


def test_a_models_stubs_are_told_apart_from_a_model_whose_name_extends_it(monkeypatch):
    instances = {11: "identity_latte_0_0", 12: "identity_latte_0_1", 13: "identity_latte_scheduler_lane_0_0",
                 14: "identity_stock_0_0"}
    monkeypatch.setattr(procmem, "stub_pids", lambda server_pid: sorted(instances))
    monkeypatch.setattr(procmem, "stub_instance", instances.get)
    assert cpu.model_stub_pids(1, "identity_latte") == [11, 12]
    assert cpu.model_stub_pids(1, "identity_stock") == [14]


def test_a_stub_that_ends_between_listing_and_reading_is_no_instance_of_any_model():
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()   # its /proc entry is gone, as a stub's is once its instance unloads
    assert procmem.stub_instance(ended.pid) == "?"


def test_the_machine_is_charged_at_least_for_this_process_working():
    """The whole machine's busy time counts this process's work (and whatever else runs)."""
    before_box, before_own = cpu.box_busy_seconds(), cpu.process_cpu_seconds(os.getpid())
    _busy(0.3)
    own = cpu.process_cpu_seconds(os.getpid()) - before_own
    assert cpu.box_busy_seconds() - before_box >= own - 0.05


def test_a_streaming_window_reads_the_cores_busy_while_it_is_open():
    """This process busy through the whole window, a sleeping one beside it, and a counter that
    runs at 0.75 CPU seconds a second: the window reads the counter at 0.75 cores (a rate, not
    seconds), this process above the sleeper, each within one core (one thread each), and the
    machine at least as busy as this process. How much of a core this process gets depends on
    what else the box runs, so no share of it is asked, only that it got some."""
    from latte.bench.streams import BusyCores

    with _sleeper() as pid:
        window = BusyCores(0.05, 0.4, lambda: {"this process": cpu.process_cpu_seconds(os.getpid()),
                                               "a sleeper": cpu.process_cpu_seconds(pid),
                                               "a counter": 0.75 * time.perf_counter()})
        _busy_for_wall(0.05 + 0.4 + 0.5)  # past the close, which a late timer may read after 0.45 s
        busy = window.result()
    assert set(busy) == {"machine", "this process", "a sleeper", "a counter"}
    assert busy["a counter"] == pytest.approx(0.75, rel=0.2)
    assert 0 <= busy["a sleeper"] < 0.05
    assert 0.05 <= busy["this process"] <= 1.1
    assert busy["this process"] > busy["a sleeper"]
    assert busy["this process"] - 0.1 <= busy["machine"] <= os.cpu_count() + 0.1
