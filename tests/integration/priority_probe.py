"""Test-only models for test_priorities.py, written into the shared server's repository
by conftest.py: each request of an execute call lands in its own shape bucket, so one call
holds 8 model calls of 10-20 ms each (single-threaded), run in the order the backend chooses."""

from __future__ import annotations

import numpy as np

PRIORITY_PROBES = {"priority_probe": 1, "priority_probe_lanes": 2}   # name -> scheduler lanes
# One bucket per request length: the 8 requests of a call (max_batch_size 8) become 8 model
# calls, run in the order the backend chooses.
PRIORITY_PROBE_LENGTHS = (448, 456, 464, 472, 480, 488, 496, 504)
PRIORITY_PROBE_LAYERS = 6


def priority_probe_onnx(layers: int = PRIORITY_PROBE_LAYERS):
    """x [batch, length] -> y [batch, 1]: the mean of tanh-chained matmuls of x's outer
    product, so one call costs milliseconds (length^3 per layer) and answers are checkable."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Unsqueeze", ["x", "axis2"], ["column"]),
             helper.make_node("Unsqueeze", ["x", "axis1"], ["row"]),
             helper.make_node("Mul", ["column", "row"], ["h0"])]
    for i in range(layers):
        nodes += [helper.make_node("MatMul", [f"h{i}", "h0"], [f"m{i}"]),
                  helper.make_node("Tanh", [f"m{i}"], [f"h{i + 1}"])]
    nodes += [helper.make_node("ReduceMean", [f"h{layers}"], ["row_mean"], axes=[2], keepdims=0),
              helper.make_node("ReduceMean", ["row_mean"], ["y"], axes=[1], keepdims=1)]
    graph = helper.make_graph(
        nodes, "priority_probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "length"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
        initializer=[helper.make_tensor("axis1", TensorProto.INT64, [1], [1]),
                     helper.make_tensor("axis2", TensorProto.INT64, [1], [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def priority_probe_reference(x: np.ndarray, layers: int = PRIORITY_PROBE_LAYERS) -> np.ndarray:
    h0 = x[:, :, None].astype(np.float64) * x[:, None, :]
    h = h0
    for _ in range(layers):
        h = np.tanh(h @ h0)
    return h.mean(axis=(1, 2))[:, None]


def write_priority_probes(repo) -> None:
    import onnx

    model = priority_probe_onnx()
    edges = ",".join(str(n) for n in PRIORITY_PROBE_LENGTHS)
    for name, lanes in PRIORITY_PROBES.items():
        (repo / name / "1").mkdir(parents=True)
        onnx.save(model, str(repo / name / "1" / "model.onnx"))
        (repo / name / "config.pbtxt").write_text(f"""name: "{name}"
backend: "latte"
max_batch_size: 8
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
# A long window: the 8 requests of a burst always share one execute call.
dynamic_batching {{ max_queue_delay_microseconds: 2000000 }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters [
  {{ key: "bucket_edges" value: {{ string_value: "{edges}" }} }},
  # Padding changes this model's answer, and the test needs one model call per request.
  {{ key: "batch_planning" value: {{ string_value: "bucket" }} }},
  {{ key: "lanes" value: {{ string_value: "{lanes}" }} }},
  {{ key: "intra_op_threads" value: {{ string_value: "1" }} }},
  {{ key: "inter_op_threads" value: {{ string_value: "1" }} }},
  {{ key: "warmup" value: {{ string_value: "false" }} }}
]
""")
