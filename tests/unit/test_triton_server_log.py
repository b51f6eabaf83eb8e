"""tritonserver's log: where it goes, and what held the server up as it stopped, read from
its countdown lines (stop_waits; the lines below are tritonserver 2.51's own)."""

import tempfile

from latte.triton.server import TritonServer, stop_waits

A_QUICK_STOP = """\
Signal (15) received.
I1128 00:00:42.264001 2160 server.cc:305] "Waiting for in-flight requests to complete."
I1128 00:00:42.264036 2160 server.cc:321] "Timeout 30: Found 0 model versions that have in-flight inferences"
I1128 00:00:42.264401 2160 server.cc:336] "All models are stopped, unloading models"
I1128 00:00:42.264422 2160 server.cc:345] "Timeout 30: Found 3 live models and 0 in-flight non-inference requests"
I1128 00:00:43.264629 2160 server.cc:345] "Timeout 29: Found 3 live models and 0 in-flight non-inference requests"
I1128 00:00:43.808060 2160 model_lifecycle.cc:624] "successfully unloaded 'textgen_stock' version 1"
I1128 00:00:44.264903 2160 server.cc:345] "Timeout 28: Found 0 live models and 0 in-flight non-inference requests"
"""


def countdown(what: str, counts) -> str:
    return "".join(f'I1127 23:52:{15 + i:02d}.432970 29001 server.cc:248] "Timeout {30 - i}: Found {count} {what}"\n'
                   for i, count in enumerate(counts))


def test_unloading_the_models_for_two_seconds_is_no_wait():
    assert stop_waits(A_QUICK_STOP) == []


def test_an_open_http_connection_held_the_stop_for_the_whole_exit_timeout():
    log = "Signal (15) received.\n" + countdown("HTTP service connections", [1] * 30)
    assert stop_waits(log) == [("1 HTTP service connections", 30)]


def test_a_model_that_would_not_unload_is_named_with_its_last_count_and_how_long_it_waited():
    log = countdown("live models and 0 in-flight non-inference requests", [3, 3, 2, 2, 2, 2, 2, 2, 2, 0])
    assert stop_waits(log) == [("2 live models and 0 in-flight non-inference requests", 9)]
    assert stop_waits(log, longer_than_s=9) == []


def test_a_server_only_inspected_leaves_no_log_file_and_one_asked_for_its_log_gets_one(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "repo").mkdir()
    server = TritonServer(tmp_path / "repo")
    assert server.command() and list(tmp_path.glob("tritonserver-*.log")) == []
    assert server.log_path.parent == tmp_path and server.log_path.exists()
    assert list(tmp_path.glob("tritonserver-*.log")) == [server.log_path]
    given = TritonServer(tmp_path / "repo", log_path=tmp_path / "mine.log")
    assert given.log_path == tmp_path / "mine.log" and not given.log_path.exists()


def test_a_log_is_read_whole_or_by_its_end(tmp_path):
    (tmp_path / "repo").mkdir()
    server = TritonServer(tmp_path / "repo", log_path=tmp_path / "log")
    assert server.log() == "" and server.log(last_bytes=10) == ""
    server.log_path.write_bytes(b"x" * 100 + A_QUICK_STOP.encode())
    assert server.log() == "x" * 100 + A_QUICK_STOP
    assert server.log(last_bytes=len(A_QUICK_STOP)) == A_QUICK_STOP


def test_older_releases_unquoted_lines_read_alike():
    log = countdown("HTTP service connections", [1] * 8).replace('"', "")
    assert stop_waits(log) == [("1 HTTP service connections", 8)]
