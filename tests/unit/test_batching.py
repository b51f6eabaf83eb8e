import numpy as np

from latte.backend.batching import assemble, plan_batches, split
from latte.backend.config import ModelSpec, TensorSpec
from latte.backend.requests import ParsedRequest


def spec(max_batch_size=8, ragged=True, pad_value=0.0):
    return ModelSpec(
        name="seq", inputs=(TensorSpec("tokens", np.dtype(np.int64), (-1,), ragged=ragged),),
        outputs=(TensorSpec("y", np.dtype(np.float32), (2,)),), max_batch_size=max_batch_size, runtime="onnx",
        model_path=None, intra_op_threads=1, inter_op_threads=1, instance_count=1, pad_value=pad_value,
    )


def req(rows, length, fill):
    return ParsedRequest(inputs={"tokens": np.full((rows, length), fill, np.int64)}, rows=rows)


def test_ragged_requests_share_one_batch_padded_to_the_longest():
    items = [(0, req(1, 3, 7)), (1, req(2, 5, 9))]
    groups = plan_batches(spec(pad_value=0), items)
    assert len(groups) == 1
    batch = assemble(spec(pad_value=0), groups[0])
    expected = np.array([[7, 7, 7, 0, 0], [9] * 5, [9] * 5])
    np.testing.assert_array_equal(batch.inputs["tokens"], expected)
    assert batch.members == [(0, 1), (1, 2)]


def test_fixed_shape_inputs_batch_only_with_the_same_shape():
    items = [(0, req(1, 3, 1)), (1, req(1, 4, 2)), (2, req(1, 3, 3))]
    groups = plan_batches(spec(ragged=False), items)
    assert [[pos for pos, _ in g] for g in groups] == [[0, 2], [1]]


def test_batches_never_exceed_max_batch_size():
    items = [(i, req(3, 2, i)) for i in range(5)]  # 15 rows, limit 8 -> 3 + 3, 3 + 3, 3
    groups = plan_batches(spec(max_batch_size=6), items)
    assert [sum(r.rows for _, r in g) for g in groups] == [6, 6, 3]


def test_split_returns_each_request_its_own_rows():
    items = [(4, req(1, 2, 0)), (9, req(2, 2, 0))]
    batch = assemble(spec(), items)
    outputs = {"y": np.arange(6, dtype=np.float32).reshape(3, 2)}
    first, second = split(spec(), batch, outputs)
    np.testing.assert_array_equal(first["y"], [[0, 1]])
    np.testing.assert_array_equal(second["y"], [[2, 3], [4, 5]])
