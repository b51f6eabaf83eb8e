"""The derivation against synthetic latency curves whose right answers are known by hand."""

import pytest

from latte.generator.calibrate import ServingCost
from latte.generator.derive import (DerivationError, bucket_edges, derive, health_rules,
                                    slowest_execute_ms)
from latte.generator.profile_data import Point, Profile


def make_profile(latency_by_batch, length=None, intra=1, peak=lambda b: 1000 * b, extra_points=()):
    points = [Point(batch_size=b, length=length, mean_ms=ms, p50_ms=ms, p99_ms=ms, peak_bytes=peak(b))
              for b, ms in latency_by_batch.items()]
    return Profile(model_file="m.onnx", runtime="onnx", device="cpu", intra_op_threads=intra,
                   inputs=[{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
                   outputs=[{"name": "y", "data_type": "TYPE_FP32", "dims": [2]}],
                   points=points + list(extra_points))


# Flat 2 ms up to batch 8, then linear: throughput saturates at 4000 rows/s from batch 8 on.
SATURATING = {1: 2.0, 2: 2.0, 4: 2.0, 8: 2.0, 16: 4.0, 32: 8.0, 64: 16.0}


def test_max_batch_is_largest_with_twice_p99_within_slo():
    d = derive(make_profile(SATURATING), slo_ms=20, cores=2)
    # 2 x l(32) = 16 <= 20, 2 x l(64) = 32 > 20
    assert d.max_batch_size == 32
    assert d.worst_case_ms <= 20


def test_no_queue_delay_without_a_rate():
    # Without a rate nothing says more requests will come while an instance idles.
    d = derive(make_profile(SATURATING), slo_ms=20, cores=2)
    assert d.dynamic_batching["max_queue_delay_microseconds"] == 0
    assert d.worst_case_ms == pytest.approx(16.0)


def test_queue_delay_waits_for_the_batch_the_rate_needs():
    # 3000 req/s on one instance: batch 1 gives 500 rows/s, 2 -> 1000, 4 -> 2000, 8 -> 4000 (x 0.8 = 3200 >= 3000).
    # Filling 7 more slots at 3000 req/s takes 2333 us, within the slack 20 - 2 x 8 = 4 ms.
    d = derive(make_profile(SATURATING), slo_ms=20, arrival_rate=3000, cores=1)
    assert d.dynamic_batching["max_queue_delay_microseconds"] == 2333
    # A light load that batch 1 already serves needs no waiting.
    assert derive(make_profile(SATURATING), slo_ms=20, arrival_rate=100, cores=1).dynamic_batching[
        "max_queue_delay_microseconds"] == 0


def test_queue_delay_never_exceeds_the_slack_left_by_two_batches():
    d = derive(make_profile(SATURATING), slo_ms=17, arrival_rate=3000, cores=1)
    assert d.dynamic_batching["max_queue_delay_microseconds"] == 1000  # 17 - 2 x 8 ms
    assert d.worst_case_ms == pytest.approx(17.0)


def test_queue_delay_is_the_fill_time_when_the_rate_is_high():
    # 1 ms per batch at every size; 10000 req/s over 2 instances fill 3 more slots of batch 4 in 600 us.
    profile = make_profile({1: 1.0, 2: 1.0, 4: 1.0, 8: 5.0})
    d = derive(profile, slo_ms=5, arrival_rate=10000, cores=2)
    assert d.max_batch_size == 4
    assert d.instance_count == 2          # 10000 / (4000 rows/s x 0.8) -> 4, capped by 2 cores
    assert d.dynamic_batching["max_queue_delay_microseconds"] == 600
    assert any("warning" in line for line in d.explanation)


def test_preferred_batch_size_set_where_throughput_saturates():
    d = derive(make_profile(SATURATING), slo_ms=20, cores=2)
    assert d.dynamic_batching["preferred_batch_size"] == [8]


def test_preferred_batch_size_absent_while_throughput_keeps_growing():
    growing = {1: 1.5, 2: 2.0, 4: 3.0, 8: 5.0, 16: 9.0}
    d = derive(make_profile(growing), slo_ms=20, cores=2)
    assert d.max_batch_size == 16
    assert "preferred_batch_size" not in d.dynamic_batching


def _ragged(curves):
    first, *rest = sorted(curves)
    extra = [Point(batch_size=b, length=length, mean_ms=ms, p50_ms=ms, p99_ms=ms, peak_bytes=1000 * b)
             for length in rest for b, ms in curves[length].items()]
    return make_profile(curves[first], length=first, extra_points=extra)


def test_no_preferred_batch_size_where_short_requests_still_gain_from_bigger_batches():
    # The longest length saturates at batch 8; at 16 tokens throughput doubles up to batch 32. A
    # preferred size of 8 would make Triton cut a deep queue of short requests into batches of 8.
    d = derive(_ragged({128: SATURATING, 16: {1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0, 16: 1.0, 32: 1.0, 64: 4.0}}),
               slo_ms=20, cores=2)
    assert d.max_batch_size == 32
    assert "preferred_batch_size" not in d.dynamic_batching
    assert any("preferred_batch_size: not set; throughput keeps improving up to max_batch_size at length 16"
               in line for line in d.explanation)


def test_a_ragged_model_prefers_the_batch_where_every_length_has_saturated():
    d = derive(_ragged({128: SATURATING, 16: {1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0, 16: 1.0, 32: 2.0, 64: 4.0}}),
               slo_ms=20, cores=2)
    assert d.dynamic_batching["preferred_batch_size"] == [16]
    assert any("preferred_batch_size [16]: throughput saturates there at every measured length "
               "(the last to saturate: 16)" in line for line in d.explanation)


def test_instances_fill_the_thread_budget_without_a_rate():
    assert derive(make_profile(SATURATING), slo_ms=20, cores=4).instance_count == 4
    assert derive(make_profile(SATURATING, intra=2), slo_ms=20, cores=5).instance_count == 2
    d = derive(make_profile(SATURATING, intra=2), slo_ms=20, cores=5)
    assert d.instance_count * int(d.parameters["intra_op_threads"]) <= 5


def test_instances_follow_the_arrival_rate():
    # 4000 rows/s per instance at 80% utilisation: 1000 req/s need one instance.
    assert derive(make_profile(SATURATING), slo_ms=20, arrival_rate=1000, cores=8).instance_count == 1
    # One instance behind Triton's priority levels and queue policy stalls (docs/backend.md,
    # Priorities), so with priorities in Triton's queue two are rendered.
    d = derive(make_profile(SATURATING), slo_ms=20, arrival_rate=1000, cores=8, priority_levels=2,
               priority_queue="triton")
    assert d.instance_count == 2
    assert "instance count raised to 2" in d.explain()
    d = derive(make_profile(SATURATING), slo_ms=20, arrival_rate=7000, cores=8)
    assert d.instance_count == 3


def test_queue_policy_delays_requests_that_cannot_make_the_slo():
    # Only behind Triton's priority levels: without them a policy costs throughput within the SLO.
    assert "default_queue_policy" not in derive(make_profile(SATURATING), slo_ms=20, cores=2).dynamic_batching
    d = derive(make_profile(SATURATING), slo_ms=20, cores=2, priority_levels=2, priority_queue="triton")
    policy = d.dynamic_batching["default_queue_policy"]
    assert policy["default_timeout_microseconds"] == 12000      # 20 - l(32) = 12 ms
    assert policy["max_queue_size"] == 2 * 32 * 1               # 2 instances x 32 x one more batch in 12 ms
    assert policy["timeout_action"] == "DELAY"


def test_priority_levels_only_when_asked():
    plain = derive(make_profile(SATURATING), slo_ms=20, cores=2)
    assert "priority_levels" not in plain.dynamic_batching and "async_execute" not in plain.parameters


def test_priority_levels_live_in_lattes_queue_by_default():
    d = derive(make_profile(SATURATING), slo_ms=20, cores=2, priority_levels=3)
    # Triton's queue passes requests on at once and holds no priorities or policy that would
    # turn its prefetching off; latte's queue is bounded and batches for as long as the delay.
    assert d.dynamic_batching == {"max_queue_delay_microseconds": 0}
    assert d.parameters["async_execute"] == "true"
    assert d.parameters["max_queue_size"] == str(32 * 1)   # batch 32 x one more batch in 12 ms
    assert d.parameters["batch_window_us"] == "0"          # no arrival rate: waiting only adds latency
    assert "priority_level 0..2 (unmarked: 0, the lowest)" in d.explain()


def test_lattes_queue_waits_in_its_batch_window_what_triton_would_have_waited():
    d = derive(make_profile(SATURATING), slo_ms=20, arrival_rate=3000, cores=1, priority_levels=2)
    assert d.parameters["batch_window_us"] == "2333"      # as max_queue_delay_microseconds above
    assert d.dynamic_batching["max_queue_delay_microseconds"] == 0


def test_triton_priority_queue_when_asked():
    d = derive(make_profile(SATURATING), slo_ms=20, cores=2, priority_levels=3, priority_queue="triton")
    assert d.dynamic_batching["priority_levels"] == 3
    assert d.dynamic_batching["default_priority_level"] == 3
    assert d.instance_count == 2 and "async_execute" not in d.parameters


def test_one_instance_gets_no_queue_policy_and_priorities_in_latte_queue():
    # One core, one intra-op thread: a single instance, which Triton 2.51 stalls behind a
    # queue policy or priority levels; Triton's queue is left unbounded, and priorities go to
    # latte's queue, or are refused in Triton's.
    d = derive(make_profile(SATURATING), slo_ms=20, cores=1)
    assert d.instance_count == 1
    assert "default_queue_policy" not in d.dynamic_batching
    assert "default_queue_policy: not set, so Triton's queue is unbounded" in d.explain()
    latte_queue = derive(make_profile(SATURATING), slo_ms=20, cores=1, priority_levels=2)
    assert latte_queue.instance_count == 1 and latte_queue.parameters["async_execute"] == "true"
    assert "default_queue_policy: not set" not in latte_queue.explain()
    with pytest.raises(DerivationError, match=r"priority_levels 2 in Triton's queue need 2 instances .* allows 1 "
                                              r"\(1 core\(s\) // intra_op_threads 1\); let latte hold the queue"):
        derive(make_profile(SATURATING), slo_ms=20, cores=1, priority_levels=2, priority_queue="triton")


def test_priority_queue_is_latte_or_triton():
    with pytest.raises(DerivationError, match=r"priority_queue must be one of latte, triton, got 'mine'"):
        derive(make_profile(SATURATING), slo_ms=20, cores=2, priority_levels=2, priority_queue="mine")
    with pytest.raises(DerivationError, match=r"latte's queue has 16 priority levels, and priority_levels asks for 17"):
        derive(make_profile(SATURATING), slo_ms=20, cores=2, priority_levels=17)


def test_arena_is_peak_with_headroom_rounded_to_a_power_of_two():
    d = derive(make_profile(SATURATING, peak=lambda b: 100_000 * b), slo_ms=20, cores=2)
    # peak at batch 32 = 3.2 MB, x 1.25 = 4 MB -> 4 MiB (4194304 >= 4000000)
    assert d.parameters["arena_bytes"] == str(1 << 22)


def test_bucket_edges_merge_lengths_with_similar_latency():
    latency_at = {16: 1.0, 32: 1.05, 64: 1.5, 128: 3.0}
    points = [Point(b, length, ms * b, ms * b, ms * b, 0) for length, ms in latency_at.items() for b in (1, 2)]
    profile = Profile("m.onnx", "onnx", "cpu", 1, [{"name": "t", "data_type": "TYPE_INT64", "dims": [-1]}],
                      [{"name": "e", "data_type": "TYPE_FP32", "dims": [4]}], points)
    assert bucket_edges(profile, 2) == [32, 64, 128]
    d = derive(profile, slo_ms=100, cores=1)
    assert d.parameters["bucket_edges"] == "32,64,128"
    # The SLO is checked at the longest length, the worst case.
    assert d.worst_case_ms >= 2 * 6.0


def test_every_chosen_number_is_explained():
    d = derive(make_profile(SATURATING), slo_ms=20, cores=2)
    text = d.explain()
    for word in ("max_batch_size 32", "instance count 2", "max_queue_delay_microseconds 0",
                 "preferred_batch_size [8]", "default_queue_policy", "arena_bytes"):
        assert word in text


def test_impossible_slo_is_refused_with_the_numbers():
    with pytest.raises(DerivationError, match=r"SLO of 3 ms cannot hold.*2 x 2.00 ms"):
        derive(make_profile(SATURATING), slo_ms=3)


def test_thread_budget_larger_than_cores_is_refused():
    with pytest.raises(DerivationError, match="intra_op_threads=4 but only 2 core"):
        derive(make_profile(SATURATING, intra=4), slo_ms=20, cores=2)


@pytest.mark.parametrize("kwargs, message", [({"slo_ms": 0}, "SLO must be a positive number"),
                                             ({"slo_ms": 10, "arrival_rate": -1}, "arrival rate must be positive"),
                                             ({"slo_ms": 10, "cores": 0}, "cores must be >= 1")])
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(DerivationError, match=message):
        derive(make_profile(SATURATING), **kwargs)


def test_backend_overhead_is_added_to_every_batch():
    # l(b) + 1 ms: 2 x l(32) = 18 <= 20 still, but the slack shrinks from 4 ms to 2 ms.
    d = derive(make_profile(SATURATING), slo_ms=20, arrival_rate=3000, cores=1,
               serving=ServingCost.flat(1.0, "spec"))
    assert d.max_batch_size == 32
    assert d.dynamic_batching["max_queue_delay_microseconds"] == 2000
    assert d.worst_case_ms == pytest.approx(20.0)
    # With 2 ms of overhead 2 x (8 + 2) = 20 still fits; with 3 ms only batch 16 does.
    assert derive(make_profile(SATURATING), slo_ms=20, serving=ServingCost.flat(3.0, "spec")).max_batch_size == 16
    with pytest.raises(DerivationError, match="serving costs must be >= 0"):
        derive(make_profile(SATURATING), slo_ms=20, serving=ServingCost.flat(-1, "spec"))


CALIBRATED = ServingCost(batch_ms=0.5, request_ms=0.05, round_trip_ms=1.0, source="calibrated")


def test_calibrated_cost_grows_with_the_batch_and_the_round_trip_is_paid_once():
    # l(b) = profile + 0.5 + 0.05 b: l(16) = 4 + 1.3 = 5.3, l(32) = 8 + 2.1 = 10.1.
    # 2 x 10.1 + 1 = 21.2 > 20, 2 x 5.3 + 1 = 11.6 <= 20: batch 16.
    d = derive(make_profile(SATURATING), slo_ms=20, cores=1, serving=CALIBRATED)
    assert d.max_batch_size == 16
    assert d.worst_case_ms == pytest.approx(11.6)
    assert "calibrated serving cost: 0.500 ms per batch + 0.050 ms per request" in d.explain()
    # Throughput is served throughput: 16 rows per 4 + 1.3 ms.
    assert d.throughput == pytest.approx(16 * 1000 / 5.3)


def test_profile_carries_its_calibration_into_the_derivation():
    profile = make_profile(SATURATING)
    profile.serving = CALIBRATED
    assert derive(profile, slo_ms=20, cores=1).max_batch_size == 16
    # An explicit cost wins over the stored one.
    assert derive(profile, slo_ms=20, cores=1, serving=ServingCost.flat(0.0, "spec")).max_batch_size == 32


def test_an_slo_the_serving_cost_alone_breaks_says_why():
    with pytest.raises(DerivationError) as info:
        derive(make_profile(SATURATING), slo_ms=6, serving=ServingCost(batch_ms=0.5, request_ms=0.05, round_trip_ms=2.0, source="calibrated"))
    message = str(info.value)
    assert "the SLO of 6 ms cannot hold" in message
    assert "0.55 ms is serving cost outside the model" in message
    assert "+ 2.00 ms client round trip" in message


def test_planned_rate_is_the_arrival_rate_else_eighty_percent_of_the_promise():
    d = derive(make_profile(SATURATING), slo_ms=20, cores=2)
    assert d.planned_rate == pytest.approx(0.8 * d.throughput)
    assert derive(make_profile(SATURATING), slo_ms=20, arrival_rate=1234, cores=2).planned_rate == 1234


def test_model_and_serving_share_the_host_so_their_times_per_request_add_up():
    # 2 instances x 4000 rows/s = 8000/s of model, 3000/s of compute-free serving on the same cores:
    # 1 / (1/8000 + 1/3000) = 2182 requests/s, planned at 80 %.
    ceiling = ServingCost(batch_ms=0.0, request_ms=0.0, round_trip_ms=0.0, max_rate=3000.0, source="calibrated")
    d = derive(make_profile(SATURATING), slo_ms=20, cores=2, serving=ceiling)
    assert d.throughput == pytest.approx(24000 / 11) and d.planned_rate == pytest.approx(0.8 * 24000 / 11)
    assert "the model's 8000 rows/s and the host's 3000 requests/s" in d.explain()


def test_request_bytes_count_the_longest_measured_length():
    from latte.generator.derive import request_bytes

    assert request_bytes(make_profile(SATURATING)) == 16                      # FP32[4]
    ragged = make_profile({1: 1.0}, length=128)
    ragged.inputs = [{"name": "tokens", "data_type": "TYPE_INT64", "dims": [-1]}]
    assert request_bytes(ragged) == 128 * 8


# --- the health rules latte serve supervises a model by -------------------------------------------------------


def test_health_rules_from_the_slo_and_the_execute_p99():
    assert health_rules(slo_ms=20, execute_p99_ms=123.0) == {
        "execute_timeout_s": "7",            # 50 x 0.123 s = 6.15 s, rounded up
        "health_p99_slo_ms": "20",
        "health_p99_window_s": "120",
        "health_cpu_pegged_percent": "90",
        "health_cpu_pegged_s": "120",
        "rejuvenate_min_interval_s": "600",
    }


@pytest.mark.parametrize("p99_ms, timeout_s", [(0.5, "5"), (100.0, "5"), (100.2, "6"), (300.0, "15"),
                                               (2000.0, "100")])
def test_execute_timeout_is_fifty_executes_and_never_under_five_seconds(p99_ms, timeout_s):
    assert health_rules(50, p99_ms)["execute_timeout_s"] == timeout_s


def test_the_rss_growth_rule_only_when_given():
    assert "health_rss_growth_mib_per_min" not in health_rules(50, 2.0)
    assert health_rules(50, 2.0, rss_growth_mib_per_min=2.5)["health_rss_growth_mib_per_min"] == "2.5"
    assert health_rules(12.5, 2.0)["health_p99_slo_ms"] == "12.5"
    with pytest.raises(DerivationError, match="health_rss_growth_mib_per_min must be > 0"):
        health_rules(50, 2.0, rss_growth_mib_per_min=0)
    with pytest.raises(DerivationError, match="positive SLO"):
        health_rules(0, 2.0)


def test_the_slowest_execute_is_the_largest_batch_allowed_at_any_length():
    from latte.generator.profile_data import Point

    longer = [Point(batch_size=b, length=128, mean_ms=ms, p50_ms=ms, p99_ms=ms, peak_bytes=0)
              for b, ms in ((1, 3.0), (8, 9.0), (16, 30.0))]
    profile = make_profile({1: 1.0, 8: 4.0, 16: 12.0}, length=16, extra_points=longer)
    assert slowest_execute_ms(profile, 8) == 9.0      # batch 16 is not allowed; length 128 is slower
    assert slowest_execute_ms(profile, 32) == 30.0
    assert slowest_execute_ms(profile, 0) == 3.0      # a model that does not batch runs one request
