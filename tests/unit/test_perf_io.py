import json

import numpy as np
import pytest

from latte.triton.perf import _step, parse_csv, write_input_data


def test_input_data_keeps_each_request_shape(tmp_path):
    path = write_input_data(tmp_path / "in.json", [{"tokens": np.arange(3)}, {"tokens": np.arange(5)}])
    data = json.loads(path.read_text())["data"]
    assert [d["tokens"]["shape"] for d in data] == [[3], [5]]
    assert data[1]["tokens"]["content"] == [0, 1, 2, 3, 4]


# Columns as perf_analyzer 2.51 writes them with -f, less the average and the two that follow it.
PERF_COLUMNS = ("Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,"
                "Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,"
                "p50 latency,p90 latency,p95 latency,p99 latency")


def test_perf_analyzer_csv_is_read_in_milliseconds(tmp_path):
    header = PERF_COLUMNS + ",Avg latency,request/response,response wait"
    (tmp_path / "r.csv").write_text(header + "\n2,1000.5,10,100,50,5,400,5,3,1500,1800,1900,2500,1600,0,0\n")
    (point,) = parse_csv(tmp_path / "r.csv")
    assert point.concurrency == 2 and point.throughput == pytest.approx(1000.5)
    assert point.p99_ms == pytest.approx(2.5) and point.compute_us == pytest.approx(410)


def test_perf_analyzer_average_latency_is_rebuilt_from_its_parts_when_the_column_is_missing(tmp_path):
    (tmp_path / "r.csv").write_text(PERF_COLUMNS + "\n2,1000.5,10,100,50,5,400,5,30,1500,1800,1900,2500\n")
    (point,) = parse_csv(tmp_path / "r.csv")
    assert point.avg_ms == pytest.approx(0.6)


def test_uneven_sweeps_are_refused():
    assert _step([1, 2, 3]) == 1
    with pytest.raises(ValueError, match="evenly spaced"):
        _step([1, 2, 4])
