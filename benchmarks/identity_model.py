"""The ONNX Identity model on FP32[WIDTH]: a model call that costs ~5 us, so what is measured
around it is the serving path's own cost (benchmarks/serving.py, execute_overhead.py)."""

from __future__ import annotations

from pathlib import Path


def write_identity_onnx(path: Path, width: int = 64) -> Path:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", width])
    y = helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", width])
    graph = helper.make_graph([helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "identity", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path
