"""The parts of a graph of steps: graph.json read and ordered once, ragged tensors that keep
their rows' lengths between steps, and Python steps run in this process."""

import json

import numpy as np
import pytest

from latte.backend.config import TensorSpec
from latte.backend.errors import ConfigError, RequestError
from latte.backend.graph.definition import load_graph
from latte.backend.graph.python_model import PythonModelStep
from latte.backend.batching import member_lengths
from latte.backend.graph.values import (Value, gather, measure_lengths, repadded, scatter,
                                        stack_members)
from latte.backend.standin_stub import InferenceResponse, Tensor, TritonError

TEXT = {"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1]}


def step(name, inputs, outputs):
    return {"name": name, "folder": f"steps/{name}", "inputs": inputs, "outputs": outputs,
            "config": {"name": name, "backend": "python"}}


def write_graph(tmp_path, steps, outputs=("OUT",)):
    for s in steps:
        (tmp_path / s["folder"] / "1").mkdir(parents=True, exist_ok=True)
    path = tmp_path / "graph.json"
    path.write_text(json.dumps({"format": "latte-graph/1", "inputs": [TEXT],
                                "outputs": [{"name": o, "data_type": "TYPE_FP32", "dims": [1]} for o in outputs],
                                "steps": steps}))
    return path


def test_steps_are_put_in_an_order_where_each_reads_what_is_already_made(tmp_path):
    path = write_graph(tmp_path, [step("post", {"X": "mid"}, {"Y": "OUT"}), step("pre", {"T": "TEXT"}, {"M": "mid"})])
    graph = load_graph(path)
    assert [s.name for s in graph.steps] == ["pre", "post"]
    assert graph.producers == {"mid": (0, "M"), "OUT": (1, "Y")}


def test_independent_steps_share_a_level_and_a_tensor_is_dropped_after_its_last_readers_level(tmp_path):
    from latte.backend.graph.graph import Graph

    # pre -> mid; two heads read mid (one also reads TEXT); a late step reads TEXT again.
    path = write_graph(tmp_path, [step("pre", {"T": "TEXT"}, {"M": "mid"}), step("head", {"X": "mid"}, {"Y": "OUT"}),
                                  step("other", {"X": "mid", "T": "TEXT"}, {"Y": "OUT2"}),
                                  step("late", {"T": "TEXT", "X": "OUT"}, {"Y": "OUT3"})],
                       outputs=("OUT", "OUT2", "OUT3"))
    levels = Graph._plan_levels(load_graph(path))
    assert levels == [((0,), ()), ((1, 2), ("mid",)), ((3,), ("TEXT",))]


@pytest.mark.parametrize("steps, message", [
    ([step("a", {"T": "TEXT"}, {"M": "OUT"}), step("b", {"T": "TEXT"}, {"M": "OUT"})],
     "step 'b' writes 'OUT', which step 'a' already provide; every graph tensor has one producer"),
    ([step("a", {"T": "nowhere"}, {"M": "OUT"})],
     "step 'a' reads 'nowhere' (its input 'T'), which no step produces and the graph does not take as an input"),
    ([step("a", {"T": "y"}, {"M": "x"}), step("b", {"T": "x"}, {"M": "y"}), step("c", {"T": "TEXT"}, {"M": "OUT"})],
     "steps 'a', 'b' wait on each other's outputs (a cycle)"),
    ([step("a", {"T": "TEXT"}, {"M": "mid"})], "graph output 'OUT' is produced by no step"),
    ([step("a", {"T": "TEXT"}, {"M": "OUT"}), step("a", {"T": "TEXT"}, {"M": "other"})], "step name 'a' is used twice"),
])
def test_a_graph_that_cannot_run_is_refused_naming_the_step(tmp_path, steps, message):
    path = write_graph(tmp_path, steps)
    with pytest.raises(ConfigError) as refused:
        load_graph(path)
    assert str(refused.value) == f"{path}: {message}"


def test_samples_must_give_every_input(tmp_path):
    path = write_graph(tmp_path, [step("a", {"T": "TEXT"}, {"M": "OUT"})])
    graph = json.loads(path.read_text())
    graph["samples"] = [{"OTHER": ["x"]}]
    path.write_text(json.dumps(graph))
    with pytest.raises(ConfigError, match="'samples' must be a list of requests, each giving every input \\(TEXT\\)"):
        load_graph(path)


def test_rows_padded_by_a_python_step_are_measured_to_their_last_value():
    ids = np.array([[4, 0, 9, 0], [3, 0, 0, 0], [0, 0, 0, 0], [1, 2, 3, 4]], dtype=np.int64)
    assert measure_lengths(ids, (1,), 0).tolist() == [3, 1, 1, 4]
    # Per-position features: a position is padding when all its features are.
    features = np.zeros((2, 3, 2), np.float32)
    features[0, 2, 1] = 5.0
    features[1, 0, 0] = 1.0
    assert measure_lengths(features, (1,), 0.0).tolist() == [3, 1]
    # Two variable axes (a numpy pass): the longer reach of the two.
    grid = np.zeros((1, 4, 4), np.int32)
    grid[0, 1, 3] = 7
    assert measure_lengths(grid, (1, 2), 0).tolist() == [4]


def test_a_value_padded_one_way_is_repadded_for_a_step_that_pads_another():
    value = Value(np.array([[5, 6, 0], [7, 0, 0]], np.int64), (1,), np.array([2, 1]), pad=0)
    assert repadded(value, 0) is value.array  # same pad: no copy
    assert repadded(value, -1).tolist() == [[5, 6, -1], [7, -1, -1]]


def test_sub_batches_are_gathered_cut_to_their_length_and_scattered_back_in_row_order():
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert gather(array, (1,), None, None) is array
    assert gather(array, (1,), np.array([2, 0]), 2).tolist() == [[8, 9], [0, 1]]
    parts = [(np.array([2, 0]), np.array([[1.0, 1.0], [2.0, 2.0]], np.float32)),
             (np.array([1]), np.array([[3.0, 3.0, 3.0]], np.float32))]
    assert scatter(parts, 3, (1,), -1.0).tolist() == [[2, 2, -1], [3, 3, 3], [1, 1, -1]]


def test_each_requests_own_arrays_become_one_value_with_their_lengths():
    value = stack_members([np.array([[1, 2]]), np.array([[3], [4]])], (1,), 0)
    assert value.array.tolist() == [[1, 2], [3, 0], [4, 0]]
    assert value.lengths.tolist() == [2, 1, 1]
    assert member_lengths(np.array([2, 1, 3]), [1, 2]) == [2, 3]


class Answers:
    """A TritonPythonModel that answers each request with its text's length, or refuses empty ones."""

    def execute(self, requests):
        responses = []
        for request in requests:
            texts = request.inputs()[0].as_numpy()
            if any(t == b"" for t in texts.reshape(-1)):
                responses.append(InferenceResponse([], TritonError("empty text", TritonError.INVALID_ARG)))
            else:
                lengths = np.array([[len(t)] for t in texts.reshape(-1)], np.float32)
                responses.append(InferenceResponse([Tensor("LENGTH", lengths)]))
        return responses


def python_step():
    return PythonModelStep("measure", Answers(), [TensorSpec("TEXT", np.dtype(object), (1,))],
                           [TensorSpec("LENGTH", np.dtype(np.float32), (1,))])


def test_a_python_model_step_gets_one_request_per_client_request():
    texts = np.array([[b"ab"], [b"abc"], [b"a"]], dtype=object)
    out = python_step().run({"TEXT": Value(texts)}, [2, 1])
    assert out["LENGTH"].array.tolist() == [[2.0], [3.0], [1.0]]


def test_a_python_model_steps_refusal_is_the_requests_fault():
    with pytest.raises(RequestError, match="^step 'measure': empty text$"):
        python_step().run({"TEXT": Value(np.array([[b"ok"], [b""]], dtype=object))}, [1, 1])


def test_a_python_model_step_is_executed_one_call_at_a_time_as_triton_calls_it():
    import threading
    import time

    class Counting(Answers):
        """Answers, noting how many calls of execute overlap."""

        def __init__(self):
            self.inside, self.most = 0, 0

        def execute(self, requests):
            self.inside += 1
            self.most = max(self.most, self.inside)
            time.sleep(0.005)  # another lane's call would come in meanwhile
            self.inside -= 1
            return super().execute(requests)

    model = Counting()
    measure = PythonModelStep("measure", model, [TensorSpec("TEXT", np.dtype(object), (1,))],
                              [TensorSpec("LENGTH", np.dtype(np.float32), (1,))])
    lanes = [threading.Thread(target=lambda: [measure.run({"TEXT": Value(np.array([[b"ab"]], dtype=object))}, [1])
                                              for _ in range(5)]) for _ in range(4)]
    for lane in lanes:
        lane.start()
    for lane in lanes:
        lane.join()
    assert model.most == 1
