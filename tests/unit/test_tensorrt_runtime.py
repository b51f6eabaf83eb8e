"""TensorRT plans: the rules every request meets (on any machine), and serving real plans (on a GPU).

The first half checks `tensorrt_io` and the load errors without tensorrt or CUDA. The second
half builds small plans with TensorRT's ONNX parser and network API and compares what the
runtime serves with onnxruntime / numpy; it runs only where tensorrt imports and torch sees a GPU.
"""

from __future__ import annotations

import enum
import importlib.util
import threading

import numpy as np
import pytest
import torch

from latte.backend.autocomplete import complete
from latte.backend.config import ConfigError
from latte.backend.runtimes import RuntimeLoadError, load_runtime
from latte.backend.runtimes.tensorrt_io import (
    SERVABLE_DTYPES,
    PlanTensor,
    ShapeRange,
    allocation_nbytes,
    check_feed,
    check_io_names,
    choose_profile,
    cuda_device_problem,
    describe_io,
    enum_name,
    is_data_dependent,
    numpy_dtype,
    output_nbytes,
    torch_dtype_name,
)
from latte.backend.runtimes.tensorrt_runtime import bytes_as, device_address, typed_buffer

HAVE_TENSORRT = importlib.util.find_spec("tensorrt") is not None
HAVE_CUDA = torch.cuda.is_available()

# An MLP-like plan: features [-1, 16] -> logits [-1, 8], batches of 1..64.
MLP_INPUTS = {"features": PlanTensor("features", np.dtype(np.float32), (-1, 16))}
MLP_OUTPUTS = {"logits": PlanTensor("logits", np.dtype(np.float32), (-1, 8))}
MLP_PROFILES = [{"features": ShapeRange((1, 16), (8, 16), (64, 16))}]


# -- dtypes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("trt_name", sorted(SERVABLE_DTYPES))
def test_each_servable_tensorrt_type_has_matching_numpy_and_torch_dtypes(trt_name):
    dtype = numpy_dtype(trt_name, "x")
    torch_type = getattr(torch, torch_dtype_name(dtype))
    assert torch.from_numpy(np.zeros(2, dtype)).dtype == torch_type
    assert torch.empty(1, dtype=torch_type).element_size() == dtype.itemsize


def test_bfloat16_io_is_refused_with_the_rebuild_flags():
    with pytest.raises(RuntimeLoadError, match=r"'logits' has TensorRT type BF16.*--outputIOFormats=fp32:chw"):
        numpy_dtype("BF16", "logits")


def test_an_unknown_tensorrt_type_names_the_servable_ones():
    with pytest.raises(RuntimeLoadError, match=r"type COMPLEX.*servable IO types: FLOAT, HALF"):
        numpy_dtype("COMPLEX", "x")


def test_enum_names_come_from_the_member_name_or_its_printed_form():
    DataType = enum.Enum("DataType", "FLOAT HALF")
    assert enum_name(DataType.HALF) == "HALF"

    class Printed:
        def __str__(self):
            return "DataType.INT64"

    assert enum_name(Printed()) == "INT64"


# -- optimization profiles ----------------------------------------------------------------------

def test_shapes_inside_the_profile_bounds_inclusive_pick_profile_zero():
    for batch in (1, 8, 64):
        assert choose_profile({"features": (batch, 16)}, MLP_PROFILES) == 0


def test_a_batch_over_the_profile_maximum_names_the_allowed_range():
    with pytest.raises(ValueError) as caught:
        choose_profile({"features": (65, 16)}, MLP_PROFILES)
    message = str(caught.value)
    assert "input 'features' shape (65, 16) is outside what the plan was built for" in message
    assert "profile 0: min (1, 16) .. max (64, 16)" in message
    assert "--minShapes" in message


def test_a_wrong_inner_dimension_is_outside_the_profile_too():
    with pytest.raises(ValueError, match=r"shape \(2, 15\) is outside"):
        choose_profile({"features": (2, 15)}, MLP_PROFILES)


def test_the_first_profile_that_accepts_the_shapes_is_chosen_and_kept_while_it_fits():
    profiles = [{"tokens": ShapeRange((1, 1), (8, 32), (32, 64))},
                {"tokens": ShapeRange((1, 65), (4, 128), (8, 512))}]
    assert choose_profile({"tokens": (4, 100)}, profiles) == 1
    assert choose_profile({"tokens": (4, 60)}, profiles, preferred=1) == 0
    wide = [{"tokens": ShapeRange((1, 1), (1, 1), (8, 512))}, {"tokens": ShapeRange((1, 1), (1, 1), (8, 512))}]
    assert choose_profile({"tokens": (2, 10)}, wide, preferred=1) == 1
    with pytest.raises(ValueError, match=r"profile 0: min \(1, 1\) .. max \(32, 64\); profile 1: min \(1, 65\)"):
        choose_profile({"tokens": (16, 600)}, profiles)


def test_inputs_each_in_some_profile_but_not_the_same_one_are_refused():
    profiles = [{"a": ShapeRange((1,), (1,), (4,)), "b": ShapeRange((1,), (1,), (4,))},
                {"a": ShapeRange((5,), (5,), (8,)), "b": ShapeRange((5,), (5,), (8,))}]
    with pytest.raises(ValueError, match="no single optimization profile accepts all input shapes together"):
        choose_profile({"a": (2,), "b": (6,)}, profiles)


def test_a_fixed_input_accepts_only_its_own_shape():
    fixed = ShapeRange.fixed((3, 32, 32))
    assert fixed.contains((3, 32, 32))
    assert not fixed.contains((3, 32, 31)) and not fixed.contains((3, 32))


# -- names and feeds --------------------------------------------------------------------------

def test_config_and_plan_names_must_agree():
    check_io_names("m.plan", ["features"], ["logits"], ["features"], ["logits", "probabilities"])
    with pytest.raises(RuntimeLoadError) as caught:
        check_io_names("m.plan", ["x"], ["y"], ["features", "mask"], ["logits"])
    message = str(caught.value)
    assert "config inputs ['x'] are not inputs of the plan" in message
    assert "plan inputs ['features', 'mask'] are missing from the config" in message
    assert "config outputs ['y'] are not outputs of the plan" in message


def test_a_feed_is_checked_for_names_dtype_and_rank():
    features = np.zeros((3, 16), np.float32)
    assert check_feed({"features": features}, MLP_INPUTS) == {"features": (3, 16)}
    with pytest.raises(ValueError, match=r"missing \['features'\], unknown \['x'\]"):
        check_feed({"x": features}, MLP_INPUTS)
    with pytest.raises(ValueError, match="input 'features' is float64; the plan takes float32"):
        check_feed({"features": features.astype(np.float64)}, MLP_INPUTS)
    with pytest.raises(ValueError, match=r"shape \(16,\); the plan takes rank 2"):
        check_feed({"features": features[0]}, MLP_INPUTS)


# -- buffers ----------------------------------------------------------------------------------

def test_output_bytes_follow_shape_and_dtype():
    assert output_nbytes("logits", (5, 8), np.dtype(np.float16)) == 80
    assert output_nbytes("scalar", (), np.dtype(np.int64)) == 8
    assert output_nbytes("empty", (0, 8), np.dtype(np.float32)) == 0


def test_a_data_dependent_output_has_no_size_before_the_engine_runs():
    assert is_data_dependent((1, -1)) and not is_data_dependent((4, 8))
    with pytest.raises(ValueError, match="depends on the data"):
        output_nbytes("indices", (1, -1), np.dtype(np.int64))


def test_empty_tensors_still_get_a_device_address():
    assert allocation_nbytes(0) == 1
    assert allocation_nbytes(4096) == 4096
    with pytest.raises(ValueError):
        allocation_nbytes(-1)


def test_typed_buffers_have_the_tensor_shape_and_a_real_address_even_when_empty():
    # The same torch calls the runtime makes on the GPU, here on CPU memory.
    logits = typed_buffer(torch, torch.float16, (5, 8), 80, "cpu")
    assert logits.shape == (5, 8) and logits.dtype == torch.float16 and logits.is_contiguous()
    empty = typed_buffer(torch, torch.float32, (0, 8), 0, "cpu")
    assert empty.shape == (0, 8) and device_address(empty) != 0
    assert device_address(logits) == logits.data_ptr()
    scalar = typed_buffer(torch, torch.int64, (), 8, "cpu")
    assert scalar.shape == ()


def test_bytes_written_by_the_engine_are_read_back_as_the_output_tensor():
    expected = np.arange(6, dtype=np.int64).reshape(1, 6)
    buffer = torch.zeros(64, dtype=torch.uint8)  # larger than needed, as an allocator may hand out
    buffer[:expected.nbytes] = torch.from_numpy(expected.reshape(-1).view(np.uint8))
    indices = bytes_as(buffer, torch.int64, (1, 6), expected.nbytes)
    np.testing.assert_array_equal(indices.numpy(), expected)


# -- auto-complete description ----------------------------------------------------------------

def test_a_batched_plan_describes_its_largest_batch_and_triton_types():
    described = describe_io(MLP_INPUTS, MLP_OUTPUTS, MLP_PROFILES)
    assert described == {
        "inputs": [{"name": "features", "data_type": "TYPE_FP32", "dims": [-1, 16]}],
        "outputs": [{"name": "logits", "data_type": "TYPE_FP32", "dims": [-1, 8]}],
        "batched": True, "max_batch_size": 64,
    }


def test_a_plan_with_a_fixed_first_dimension_is_not_batched():
    inputs = {"image": PlanTensor("image", np.dtype(np.float16), (1, 3, 8, 8))}
    outputs = {"mask": PlanTensor("mask", np.dtype(np.bool_), (1, 8, 8))}
    described = describe_io(inputs, outputs, [{"image": ShapeRange.fixed((1, 3, 8, 8))}])
    assert described["batched"] is False and "max_batch_size" not in described
    assert [t["data_type"] for t in described["inputs"] + described["outputs"]] == ["TYPE_FP16", "TYPE_BOOL"]


# -- load errors ------------------------------------------------------------------------------

def test_a_plan_on_a_cpu_instance_asks_for_kind_gpu(tmp_path):
    with pytest.raises(RuntimeLoadError, match="needs a GPU instance.*KIND_GPU"):
        load_runtime("tensorrt", tmp_path / "model.plan", ["x"], ["y"], 1, 1, device="cpu")


@pytest.mark.skipif(HAVE_TENSORRT, reason="tensorrt is installed here")
def test_a_plan_without_tensorrt_says_to_install_it(tmp_path):
    with pytest.raises(RuntimeLoadError, match="tensorrt package does not import.*pip install tensorrt"):
        load_runtime("tensorrt", tmp_path / "model.plan", ["x"], ["y"], 1, 1, device="cuda:0")


def test_gpu_problems_are_named():
    assert "KIND_GPU" in cuda_device_problem("cpu", True, 1, "12.4")
    assert "CPU-only build" in cuda_device_problem("cuda:0", False, 0, None)
    assert "sees no usable GPU" in cuda_device_problem("cuda:0", False, 0, "12.4")
    assert "cuda:2 does not exist: 1 GPU(s)" in cuda_device_problem("cuda:2", True, 1, "12.4")
    assert "cuda:N" in cuda_device_problem("cuda:first", True, 1, "12.4")
    assert cuda_device_problem("cuda:0", True, 1, "12.4") is None


@pytest.mark.skipif(HAVE_CUDA, reason="a GPU is visible here")
def test_this_machines_torch_is_reported_as_unable_to_run_plans():
    problem = cuda_device_problem("cuda:0", torch.cuda.is_available(), torch.cuda.device_count(), torch.version.cuda)
    assert problem is not None and ("CPU-only build" in problem or "no usable GPU" in problem)


@pytest.mark.skipif(HAVE_TENSORRT and HAVE_CUDA, reason="plans are described where tensorrt and a GPU exist")
def test_without_tensorrt_or_a_gpu_a_plan_config_must_name_its_tensors(tmp_path):
    (tmp_path / "model.plan").write_bytes(b"not read without tensorrt")
    with pytest.raises(ConfigError, match="tensorrt package imports and a GPU is visible.*model.plan.json"):
        complete({"name": "m", "backend": "latte"}, tmp_path)


# -- serving real plans (GPU + tensorrt) --------------------------------------------------------

needs_gpu_tensorrt = pytest.mark.skipif(not (HAVE_TENSORRT and HAVE_CUDA),
                                        reason="needs the tensorrt package and a CUDA GPU")


def build_plan(network_from, path, profile_shapes):
    """Build and save a plan; `network_from(trt, builder, network, logger)` fills the network.

    profile_shapes: input name -> (min, opt, max). TF32 is off so FP32 results match onnxruntime.
    """
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    network_from(trt, builder, network, logger)
    config = builder.create_builder_config()
    config.clear_flag(trt.BuilderFlag.TF32)
    profile = builder.create_optimization_profile()
    for name, (low, best, high) in profile_shapes.items():
        profile.set_shape(name, low, best, high)
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise RuntimeError(f"TensorRT could not build {path}")
    path.write_bytes(bytes(plan))
    return path


def from_onnx(onnx_path):
    def fill(trt, builder, network, logger):
        parser = trt.OnnxParser(network, logger)
        if not parser.parse(onnx_path.read_bytes()):
            errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
            raise RuntimeError(f"TensorRT could not parse {onnx_path}: {errors}")
    return fill


def onnx_reference(onnx_path, output):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(onnx_path), sess_options=options, providers=["CPUExecutionProvider"])
    return lambda feed: session.run([output], feed)[0]


@pytest.fixture(scope="module")
def mlp_plan(tmp_path_factory):
    from latte.examples import EXAMPLES, export

    directory = tmp_path_factory.mktemp("mlp_plan")
    onnx_path = export(EXAMPLES["mlp"], directory / "export")["onnx"]
    (directory / "1").mkdir()  # a version folder holding only the plan, as auto-complete expects
    plan = build_plan(from_onnx(onnx_path), directory / "1" / "model.plan",
                      {"features": ((1, 16), (8, 16), (64, 16))})
    return plan, onnx_reference(onnx_path, "logits")


@needs_gpu_tensorrt
def test_an_onnx_built_plan_serves_what_onnxruntime_computes_for_every_batch_size(mlp_plan):
    plan, reference = mlp_plan
    runtime = load_runtime("tensorrt", plan, ["features"], ["logits"], 1, 1, device="cuda:0")
    rng = np.random.default_rng(5)
    try:
        for batch in (1, 5, 64, 3):
            features = rng.standard_normal((batch, 16)).astype(np.float32)
            logits = runtime.run({"features": features})["logits"]
            assert logits.shape == (batch, 8) and logits.dtype == np.float32
            np.testing.assert_allclose(logits, reference({"features": features}), rtol=1e-4, atol=1e-5)
    finally:
        runtime.close()


@needs_gpu_tensorrt
def test_a_batch_beyond_the_plan_profile_fails_naming_the_range(mlp_plan):
    plan, _ = mlp_plan
    runtime = load_runtime("tensorrt", plan, ["features"], ["logits"], 1, 1, device="cuda:0")
    try:
        with pytest.raises(ValueError, match=r"shape \(65, 16\) is outside .* min \(1, 16\) .. max \(64, 16\)"):
            runtime.run({"features": np.zeros((65, 16), np.float32)})
        assert runtime.run({"features": np.zeros((64, 16), np.float32)})["logits"].shape == (64, 8)
    finally:
        runtime.close()


@needs_gpu_tensorrt
def test_lanes_calling_one_runtime_at_once_each_get_their_own_answer(mlp_plan):
    plan, reference = mlp_plan
    runtime = load_runtime("tensorrt", plan, ["features"], ["logits"], 1, 1, device="cuda:0")
    feeds = [np.full((batch, 16), batch / 10, np.float32) for batch in (1, 2, 7, 16, 33, 64)]
    results, errors = {}, []

    def lane(index):
        try:
            for _ in range(20):
                results[index] = runtime.run({"features": feeds[index]})["logits"]
        except Exception as exc:  # collected: a failing thread must fail the test
            errors.append(exc)

    threads = [threading.Thread(target=lane, args=(i,)) for i in range(len(feeds))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    runtime.close()
    assert errors == []
    for index, features in enumerate(feeds):
        np.testing.assert_allclose(results[index], reference({"features": features}), rtol=1e-4, atol=1e-5)


@needs_gpu_tensorrt
def test_config_names_the_plan_lacks_fail_at_load(mlp_plan):
    plan, _ = mlp_plan
    with pytest.raises(RuntimeLoadError, match=r"config inputs \['x'\] are not inputs of the plan"):
        load_runtime("tensorrt", plan, ["x"], ["logits"], 1, 1, device="cuda:0")


@needs_gpu_tensorrt
def test_bytes_that_are_no_plan_fail_to_deserialize_with_advice(tmp_path):
    broken = tmp_path / "model.plan"
    broken.write_bytes(b"\x00" * 512)
    with pytest.raises(RuntimeLoadError, match=r"could not deserialize .*rebuild it on this machine"):
        load_runtime("tensorrt", broken, ["x"], ["y"], 1, 1, device="cuda:0")


@needs_gpu_tensorrt
def test_auto_complete_reads_a_plan_s_tensors_and_largest_batch(mlp_plan):
    plan, _ = mlp_plan
    additions = complete({"name": "mlp_plan", "backend": "latte"}, plan.parent)
    assert additions["max_batch_size"] == 64
    assert additions["inputs"] == [{"name": "features", "data_type": "TYPE_FP32", "dims": [16]}]
    assert additions["outputs"] == [{"name": "logits", "data_type": "TYPE_FP32", "dims": [8]}]


@needs_gpu_tensorrt
def test_int64_tokens_of_any_length_serve_like_onnxruntime(tmp_path):
    from latte.examples import EXAMPLES, export

    onnx_path = export(EXAMPLES["sequence"], tmp_path)["onnx"]
    plan = build_plan(from_onnx(onnx_path), tmp_path / "model.plan",
                      {"tokens": ((1, 1), (8, 32), (32, 128))})
    reference = onnx_reference(onnx_path, "embedding")
    runtime = load_runtime("tensorrt", plan, ["tokens"], ["embedding"], 1, 1, device="cuda:0")
    rng = np.random.default_rng(9)
    try:
        for batch, length in ((1, 1), (3, 17), (32, 128)):
            tokens = rng.integers(1, 1000, size=(batch, length), dtype=np.int64)
            embedding = runtime.run({"tokens": tokens})["embedding"]
            np.testing.assert_allclose(embedding, reference({"tokens": tokens}), rtol=1e-3, atol=1e-4)
    finally:
        runtime.close()


@needs_gpu_tensorrt
def test_an_output_sized_by_the_data_comes_back_whole(tmp_path):
    def nonzero(trt, builder, network, logger):
        values = network.add_input("values", trt.float32, (-1,))
        indices = network.add_non_zero(values).get_output(0)
        indices.name = "indices"
        network.mark_output(indices)

    plan = build_plan(nonzero, tmp_path / "nonzero.plan", {"values": ((1,), (16,), (256,))})
    runtime = load_runtime("tensorrt", plan, ["values"], ["indices"], 1, 1, device="cuda:0")
    try:
        for values in (np.array([0, 3, 0, 0, 5, 1], np.float32), np.zeros(9, np.float32), np.ones(256, np.float32)):
            indices = runtime.run({"values": values})["indices"]
            np.testing.assert_array_equal(indices, np.stack(np.nonzero(values)))
    finally:
        runtime.close()
