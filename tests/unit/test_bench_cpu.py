"""CPU time per request, read from /proc: a busy process is charged, a sleeping one is not."""

import os
import subprocess
import sys
import time

import pytest

from latte.bench import cpu, procmem


def _busy(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_a_process_is_charged_for_the_cpu_it_uses_not_the_time_it_sleeps():
    before = cpu.process_cpu_seconds(os.getpid())
    _busy(0.3)
    busy = cpu.process_cpu_seconds(os.getpid()) - before
    assert 0.25 <= busy <= 0.6

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.6)"])
    try:
        time.sleep(0.2)  # past the interpreter's start-up
        start = cpu.process_cpu_seconds(sleeper.pid)
        time.sleep(0.3)
        assert cpu.process_cpu_seconds(sleeper.pid) - start < 0.05
    finally:
        sleeper.wait()


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
    from latte.bench.streams import BusyCores

    window = BusyCores(0.05, 0.4, lambda: {"this process": cpu.process_cpu_seconds(os.getpid())})
    _busy(0.5)  # one core kept busy across the window, by this process
    busy = window.result()
    assert set(busy) == {"machine", "this process"}
    assert 0.5 <= busy["this process"] <= 1.1  # a margin for a CI box that shares its cores
    assert busy["this process"] - 0.1 <= busy["machine"] <= os.cpu_count() + 0.1
