import itertools
from dataclasses import replace

import numpy as np
import pytest

from latte.backend.batching import assemble, plan_batches, split
from latte.backend.buckets import BucketPlan
from latte.backend.config import ModelSignature, ModelSpec, ServingOptions, TensorSpec
from latte.backend.planning import CostModel, partition, plan_by_cost
from latte.backend.requests import ParsedRequest


def spec(max_batch_size=8, ragged=True, pad_value=0.0, pad_to="edge"):
    signature = ModelSignature(
        name="seq", inputs=(TensorSpec("tokens", np.dtype(np.int64), (-1,), ragged=ragged),),
        outputs=(TensorSpec("y", np.dtype(np.float32), (2,)),), max_batch_size=max_batch_size, runtime="onnx",
        model_path=None)
    return ModelSpec(signature, ServingOptions(pad_value=pad_value, pad_to=pad_to))


def req(rows, length, fill):
    return ParsedRequest(inputs={"tokens": np.full((rows, length), fill, np.int64)}, rows=rows)


def test_ragged_requests_share_one_batch_padded_to_the_longest():
    items = [(0, req(1, 3, 7)), (1, req(2, 5, 9))]
    groups = plan_batches(spec(pad_value=0), items)
    assert len(groups) == 1
    batch = assemble(spec(pad_value=0), [r for _, r in groups[0]])
    expected = np.array([[7, 7, 7, 0, 0], [9] * 5, [9] * 5])
    np.testing.assert_array_equal(batch.inputs["tokens"], expected)
    assert batch.member_rows == [1, 2]


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
    batch = assemble(spec(), [r for _, r in items])
    outputs = {"y": np.arange(6, dtype=np.float32).reshape(3, 2)}
    first, second = split(spec(), batch, outputs)
    np.testing.assert_array_equal(first["y"], [[0, 1]])
    np.testing.assert_array_equal(second["y"], [[2, 3], [4, 5]])


def test_ragged_lengths_are_each_rows_own_and_each_requests_only_when_answers_are_cut():
    # A graph's runtime says how far each row of a ragged output reaches; the batch says how far
    # each row of its inputs did; both per row, as a graph's values carry them.
    two_rows, one_row = req(2, 5, 9), req(1, 3, 7)
    batch = assemble(spec(pad_to="longest"), [two_rows, one_row])
    assert list(batch.lengths) == [5, 5, 3] and batch.padded_length == 5
    tokens = replace(spec().signature.outputs[0], name="tokens_out", dims=(-1,))
    ragged_out = replace(spec(), signature=replace(spec().signature, outputs=(tokens,)))
    outputs = {"tokens_out": np.arange(15, dtype=np.float32).reshape(3, 5)}
    first, second = split(ragged_out, batch, outputs, own={"tokens_out": np.array([4, 2, 3])})
    assert first["tokens_out"].shape == (2, 4)   # the request's longest row: max(4, 2)
    np.testing.assert_array_equal(second["tokens_out"], [[10, 11, 12]])
    alone = assemble(spec(), [req(1, 3, 7)])
    assert list(alone.lengths) == [3] and assemble(spec(ragged=False), [req(1, 3, 7)]).lengths is None


# -- cost-aware planning --------------------------------------------------------------------
BUCKETS = BucketPlan([16, 32, 64, 128])


def set_partitions(items):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for smaller in set_partitions(rest):
        yield [[first]] + smaller
        for i in range(len(smaller)):
            yield smaller[:i] + [[first] + smaller[i]] + smaller[i + 1:]


def plan_cost(batches, lengths, rows, cost):
    """A batch pads to its longest member's edge; a request alone runs at its own length."""
    return sum(cost.alone_cost(lengths[b[0]], rows[b[0]]) if len(b) == 1
               else cost.fixed_s + cost.row_cost(BUCKETS.edge_for(max(lengths[i] for i in b))) * sum(rows[i] for i in b)
               for b in batches)


def random_cost_model(rng):
    """A cost line per edge and, half the time, measured one-row calls beside it."""
    per_row = np.cumsum(rng.uniform(0.0, 3.0, size=len(BUCKETS.edges)))
    fixed = float(rng.uniform(0.0, 20.0))
    single = None
    if rng.random() < 0.5:
        single = dict(zip(BUCKETS.edges, (fixed * rng.uniform(0.2, 1.2) + per_row).tolist()))
    return CostModel(fixed, dict(zip(BUCKETS.edges, per_row.tolist())), single)


def test_the_plan_is_the_cheapest_of_all_partitions_for_one_row_requests():
    rng = np.random.default_rng(20261121)
    for _ in range(150):
        n = int(rng.integers(1, 8))
        lengths = rng.integers(1, 129, size=n).tolist()
        rows = [1] * n
        cost = random_cost_model(rng)
        max_rows = int(rng.integers(1, n + 1))
        plan = plan_by_cost(lengths, rows, BUCKETS.edge_for, cost, max_rows)
        assert sorted(i for b in plan for i in b) == list(range(n))
        assert all(len(b) <= max_rows for b in plan)
        best = min(plan_cost(p, lengths, rows, cost) for p in set_partitions(list(range(n)))
                   if all(len(b) <= max_rows for b in p))
        assert plan_cost(plan, lengths, rows, cost) == pytest.approx(best, rel=1e-12)


def test_multi_row_requests_get_the_cheapest_contiguous_plan_within_max_batch_size():
    rng = np.random.default_rng(7)
    for _ in range(150):
        n = int(rng.integers(1, 9))
        lengths = sorted(rng.integers(1, 129, size=n).tolist())
        rows = rng.integers(1, 5, size=n).tolist()
        cost = random_cost_model(rng)
        max_rows = int(rng.integers(4, 10))
        runs = partition(lengths, rows, BUCKETS.edge_for, cost, max_rows)
        assert all(sum(rows[s:e]) <= max_rows for s, e in runs)
        best = float("inf")
        for cuts in itertools.product([False, True], repeat=n - 1):
            bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [n]
            batches = [list(range(s, e)) for s, e in zip(bounds, bounds[1:])]
            if all(sum(rows[i] for i in b) <= max_rows for b in batches):
                best = min(best, plan_cost(batches, lengths, rows, cost))
        plan = [list(range(s, e)) for s, e in runs]
        assert plan_cost(plan, lengths, rows, cost) == pytest.approx(best, rel=1e-12)


def test_a_request_larger_than_max_batch_size_runs_alone():
    runs = partition([5, 6, 7], [2, 9, 2], BUCKETS.edge_for, CostModel(100.0, {16: 1.0}), max_rows=8)
    assert runs == [(0, 1), (1, 2), (2, 3)]


def test_a_high_fixed_cost_merges_buckets_and_a_high_row_cost_keeps_them_apart():
    lengths, rows = [100, 3, 20, 5], [1, 1, 1, 1]
    call_bound = CostModel(1000.0, {16: 1.0, 32: 2.0, 64: 4.0, 128: 8.0})
    assert plan_by_cost(lengths, rows, BUCKETS.edge_for, call_bound, 32) == [[1, 3, 2, 0]]
    row_bound = CostModel(1.0, {16: 10.0, 32: 20.0, 64: 40.0, 128: 80.0})
    # Padding 3 and 5 to 16 costs more than two calls at their own lengths.
    assert plan_by_cost(lengths, rows, BUCKETS.edge_for, row_bound, 32) == [[1], [3], [2], [0]]


def test_cost_models_refuse_what_the_planner_cannot_use():
    with pytest.raises(ValueError, match="must not decrease"):
        CostModel(1.0, {16: 2.0, 32: 1.0})
    with pytest.raises(ValueError, match=">= 0"):
        CostModel(-1.0, {16: 1.0})
    with pytest.raises(ValueError, match="at least one"):
        CostModel(1.0, {})
    with pytest.raises(ValueError, match="sorted"):
        partition([5, 3], [1, 1], BUCKETS.edge_for, CostModel(1.0, {16: 1.0}), 4)


def test_fitting_takes_a_least_squares_line_per_edge():
    model = CostModel.fit({16: [(1, 0.0011), (8, 0.0018)], 32: [(1, 0.0012), (4, 0.0018), (8, 0.0026)],
                           64: [(1, 0.0013), (8, 0.0013)]})
    assert model.per_row_s[16] == pytest.approx(0.0001)
    assert model.per_row_s[32] == pytest.approx(0.0002, rel=0.01)
    assert model.per_row_s[64] == model.per_row_s[32]  # measured flat: kept at the smaller edge's cost
    assert model.fixed_s == pytest.approx(0.001, rel=0.01)  # median intercept of 1.0, ~1.0, 1.3 ms
    assert model.row_cost(256) == pytest.approx(4 * model.per_row_s[64])  # past the last edge: scaled by length
    with pytest.raises(ValueError, match="at least two row counts"):
        CostModel.fit({16: [(4, 0.001), (4, 0.002)]})


def test_measured_one_row_calls_keep_requests_apart_when_one_call_each_is_cheaper():
    # The line through batches of 8..32 rows says 100 us per call; one-row calls measured 40-60 us.
    line = {16: 10.0, 32: 20.0, 64: 40.0, 128: 80.0}
    lengths, rows = [10, 12, 30], [1, 1, 1]
    by_line = CostModel(100.0, line)
    assert plan_by_cost(lengths, rows, BUCKETS.edge_for, by_line, 32) == [[0, 1, 2]]
    measured = CostModel(100.0, line, {16: 40.0, 32: 55.0, 64: 80.0, 128: 140.0})
    # Alone: ~40 + ~40 + ~55 = 135 us; together at 32: 100 + 3 x 20 = 160 us.
    assert plan_by_cost(lengths, rows, BUCKETS.edge_for, measured, 32) == [[0], [1], [2]]
    assert measured.alone_cost(24, 1) == pytest.approx(47.5)  # between the 16 and 32 measurements
    assert measured.alone_cost(256, 1) == pytest.approx(280.0)  # past the last: in proportion
    assert measured.alone_cost(24, 2) == by_line.alone_cost(24, 2)  # two rows: the line


def test_fitting_keeps_one_row_calls_apart_from_the_batch_line():
    model = CostModel.fit({16: [(1, 40e-6), (8, 180e-6), (16, 260e-6), (32, 420e-6)],
                           32: [(1, 55e-6), (8, 260e-6), (16, 420e-6), (32, 740e-6)]})
    assert model.single_s == {16: pytest.approx(40e-6), 32: pytest.approx(55e-6)}
    assert model.per_row_s[16] == pytest.approx(10e-6) and model.per_row_s[32] == pytest.approx(20e-6)
    assert model.fixed_s == pytest.approx(100e-6, rel=0.01)


def test_a_model_whose_cost_does_not_fall_with_the_length_keeps_its_short_requests_in_one_batch():
    # A ranker: its dense tower costs 3.9 ms per one-row call at any length, 30 ms for 64 rows.
    one_edge = CostModel(3.4e-3, {64: 0.42e-3}, single_s={64: 3.9e-3})
    lengths, rows = [4, 9, 16, 30, 60], [1] * 5
    # One measured length says nothing of shorter ones: they are priced as that length, not
    # a sixteenth of it, and the plan is one call.
    assert one_edge.alone_cost(4, 1) == pytest.approx(3.9e-3) and one_edge.row_cost(4) == pytest.approx(0.42e-3)
    for padded_to in (BucketPlan([64]).edge_for, lambda length: length):  # pad_to: edge, longest
        assert plan_by_cost(lengths, rows, padded_to, one_edge, 64) == [[0, 1, 2, 3, 4]]
    # Measured shorter lengths are taken as measured.
    timed = CostModel.fit({64: [(1, 3.9e-3), (4, 5.1e-3), (8, 6.8e-3), (16, 10.1e-3)]},
                          one_row={4: 3.85e-3, 8: 3.9e-3, 16: 3.88e-3, 32: 3.9e-3})
    assert timed.single_s[4] == pytest.approx(3.85e-3) and timed.single_s[64] == pytest.approx(3.9e-3)
    assert timed.alone_cost(12, 1) == pytest.approx(3.9e-3)  # kept non-decreasing: 16's 3.88 is raised to 8's 3.9
    assert plan_by_cost(lengths, rows, lambda length: length, timed, 64) == [[0, 1, 2, 3, 4]]
    # Two measured edges: below the first, along the line through them, at least in proportion.
    linear = CostModel(1e-4, {16: 20e-6, 32: 36e-6})  # 4 us + 1 us per token
    assert linear.row_cost(8) == pytest.approx(12e-6) and linear.row_cost(24) == pytest.approx(28e-6)
    assert CostModel(1e-4, {16: 16e-6, 32: 64e-6}).row_cost(8) == pytest.approx(8e-6)  # steeper: proportion


def test_planned_batches_pad_to_the_edge_of_their_longest_member_and_split_back_unpadded():
    s = spec(max_batch_size=8)
    items = [(0, req(1, 3, 7)), (1, req(1, 20, 8)), (2, req(1, 40, 9))]
    merge_all = CostModel(1000.0, {16: 1.0, 32: 2.0, 64: 4.0, 128: 8.0})
    groups = plan_batches(s, items, BUCKETS, merge_all)
    assert [[pos for pos, _ in g] for g in groups] == [[0, 1, 2]]
    batch = assemble(s, [r for _, r in groups[0]], BUCKETS)
    assert batch.padded_length == 64 and batch.inputs["tokens"].shape == (3, 64)
    np.testing.assert_array_equal(batch.inputs["tokens"][0], [7] * 3 + [0] * 61)
    per_token = replace(s, signature=replace(s.signature, outputs=(TensorSpec("y", np.dtype(np.float32), (-1,)),)))
    outputs = {"y": batch.inputs["tokens"].astype(np.float32)}
    parts = split(per_token, batch, outputs)
    for (pos, request), part in zip(groups[0], parts):
        np.testing.assert_array_equal(part["y"], request.inputs["tokens"].astype(np.float32))


def test_without_a_cost_model_requests_of_different_buckets_never_share_a_batch():
    items = [(0, req(1, 3, 1)), (1, req(1, 20, 2)), (2, req(1, 5, 3))]
    groups = plan_batches(spec(), items, BUCKETS)
    assert [[pos for pos, _ in g] for g in groups] == [[0, 2], [1]]


def test_cost_planned_batches_never_exceed_max_batch_size():
    rng = np.random.default_rng(3)
    items = [(i, req(int(rng.integers(1, 4)), int(rng.integers(1, 129)), i)) for i in range(30)]
    merge_all = CostModel(1000.0, {16: 1.0, 32: 2.0, 64: 4.0, 128: 8.0})
    groups = plan_batches(spec(max_batch_size=8), items, BUCKETS, merge_all)
    assert sorted(pos for g in groups for pos, _ in g) == list(range(30))
    assert all(sum(r.rows for _, r in g) <= 8 for g in groups)
    # Calls dominate the cost: as few batches as filling them in length order allows.
    fewest, rows = 1, 0
    for _, r in sorted(items, key=lambda item: (item[1].inputs["tokens"].shape[1], item[0])):
        if rows + r.rows > 8:
            fewest, rows = fewest + 1, 0
        rows += r.rows
    assert len(groups) == fewest


def test_a_plan_never_costs_more_than_one_call_per_request():
    rng = np.random.default_rng(11)
    for _ in range(100):
        n = int(rng.integers(1, 12))
        lengths = rng.integers(1, 129, size=n).tolist()
        rows = rng.integers(1, 4, size=n).tolist()
        cost = random_cost_model(rng)
        plan = plan_by_cost(lengths, rows, BUCKETS.edge_for, cost, 16)
        one_by_one = plan_cost([[i] for i in range(n)], lengths, rows, cost)
        assert plan_cost(plan, lengths, rows, cost) <= one_by_one * (1 + 1e-12)


def test_a_request_alone_in_its_batch_is_not_padded_to_its_bucket():
    alone = assemble(spec(), [req(2, 20, 1)], BUCKETS)
    assert alone.inputs["tokens"].shape == (2, 20)
    together = assemble(spec(), [req(1, 20, 1), req(1, 3, 1)], BUCKETS)
    assert together.inputs["tokens"].shape == (2, 32)


def test_with_pad_to_longest_a_planned_batch_pads_to_its_longest_member_and_is_priced_so():
    s = spec(max_batch_size=8, pad_to="longest")
    items = [(0, req(1, 3, 7)), (1, req(1, 20, 8)), (2, req(1, 40, 9))]
    merge_all = CostModel(1000.0, {16: 1.0, 32: 2.0, 64: 4.0, 128: 8.0})
    (group,) = plan_batches(s, items, BUCKETS, merge_all)
    batch = assemble(s, [r for _, r in group], BUCKETS)
    assert batch.padded_length == 40 and batch.inputs["tokens"].shape == (3, 40)
    # Priced at the longest member's length: 40/64 of the 64 edge's 4.0 per row.
    assert merge_all.fixed_s + merge_all.row_cost(40) * 3 == pytest.approx(1000.0 + 3 * 2.5)


def test_a_cost_model_prices_a_length_the_same_each_time_and_keeps_a_bounded_number_of_them():
    model = CostModel(100e-6, {16: 10e-6, 128: 80e-6}, single_s={16: 50e-6, 128: 200e-6})
    first = [model.alone_cost(n, 1) for n in range(1, 200)] + [model.row_cost(n) for n in range(1, 200)]
    again = [model.alone_cost(n, 1) for n in range(1, 200)] + [model.row_cost(n) for n in range(1, 200)]
    assert first == again
    assert model.alone_cost(72, 1) == pytest.approx(50e-6 + 150e-6 * (72 - 16) / 112)
    for n in range(1, 10_000):  # a client sending every length there is
        model.alone_cost(n, 1)
        model.row_cost(n)
    assert len(model._alone_costs) <= 4096 and len(model._row_costs) <= 4096
    assert model.alone_cost(9_999, 1) == pytest.approx(200e-6 * 9_999 / 128)  # priced all the same
