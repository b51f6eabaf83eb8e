"""Serving settings derived from a measured latency curve and a P99 latency SLO.

The argument is the one Nexus (SOSP '19) makes for batching under an SLO. Let l(b) be
the P99 latency of one batch of b requests. The unluckiest request arrives just after
its instance launched a batch: it waits up to l(b) for that batch to finish, up to the
queue delay d while its own batch forms, then l(b) for its own batch, and it pays the
client round trip r once. Hence

    2 * l(b) + d + r <= SLO

where l(b) is the profile's P99 plus the serving cost of a batch of b measured on a real
server (`latte.generator.calibrate`), and max_batch_size is the largest measured b meeting it. Everything here is a pure
function of its arguments so that each rule can be tested against known answers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from latte._native import PRIORITY_LEVELS
from latte.generator.calibrate import ServingCost
from latte.generator.profile_data import Point, Profile
from latte.generator.validate import STALL_FREE_INSTANCES

# A larger batch must add at least this much throughput to count as an improvement.
SATURATION_GAIN = 1.05
# Padding a ragged batch up to the next length must cost at least this much more
# latency before that length deserves its own bucket.
BUCKET_SPLIT_RATIO = 1.15
# Target utilisation when an arrival rate is given: queues grow without bound near 1.
TARGET_UTILISATION = 0.8
# The arena holds the largest batch's working set plus room for fragmentation.
ARENA_HEADROOM = 1.25
MIN_ARENA_BYTES = 1 << 20
# Per-batch serving cost assumed for a profile taken without calibration (an older
# profile.json): about 1 ms per batch on the 2-core reference box, from served vs
# in-process latency of the example MLP.
DEFAULT_BACKEND_OVERHEAD_MS = 1.0
# Whose queue holds a spec's priority classes. latte's: `async_execute: true` hands every request to
# latte's scheduler at once, which runs the higher priority_level first and sheds the lowest when
# full. Triton's: the dynamic batcher's priority levels, which turn its prefetching off and so
# stall (docs/backend.md, "Priorities"); under a 512-request flood its generated two-instance
# config left 1-2 % of high-priority requests ~500 ms behind (docs/benchmarks.md).
PRIORITY_QUEUES = ("latte", "triton")
DEFAULT_PRIORITY_QUEUE = "latte"


class DerivationError(ValueError):
    """The SLO cannot be met with the measured model, or the inputs are impossible."""


@dataclass
class Derivation:
    max_batch_size: int
    dynamic_batching: Dict
    instance_count: int
    instance_kind: str
    parameters: Dict[str, str]
    worst_case_ms: float           # 2 * l(b) + d + r: the bound the SLO is checked against
    throughput: float              # predicted rows/s of all instances at max_batch_size
    planned_rate: float = 0.0      # the load the settings are for: the arrival rate, else 80% of throughput
    slo_ms: float = 0.0
    explanation: List[str] = field(default_factory=list)

    def instance_groups(self) -> List[Dict]:
        return [{"count": self.instance_count, "kind": self.instance_kind}]

    def explain(self) -> str:
        return "\n".join(f"  - {line}" for line in self.explanation)


def _round_up_pow2(value: float) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1.0, value))))


def _knee(curve: List[Point], limit: int) -> Point:
    """The smallest batch size after which throughput stops improving by SATURATION_GAIN."""
    candidates = [p for p in curve if p.batch_size <= limit]
    knee = candidates[0]
    for p in candidates[1:]:
        if p.throughput < knee.throughput * SATURATION_GAIN:
            break
        knee = p
    return knee


def _served_curve(profile: Profile, serving: ServingCost, length: Optional[int] = None) -> List[Point]:
    """One bucket's points with the serving cost of each batch added: what a client sees."""
    curve = []
    for p in profile.curve(length):
        extra = serving.batch_overhead_ms(p.batch_size)
        curve.append(Point(p.batch_size, p.length, p.mean_ms + extra, p.p50_ms + extra, p.p99_ms + extra,
                           p.peak_bytes))
    return curve


def _saturation(profile: Profile, serving: ServingCost, limit: int) -> Tuple[Point, Point]:
    """The knee that holds at every measured length, and that length's served point at `limit`.

    Triton's batcher launches a preferred size as soon as the queue holds it, also when more
    is waiting, so a preferred size caps the batches of a deep queue. Short requests of a ragged
    model gain from batches well past the longest length's knee; capping them there costs
    throughput, so the knee is the largest one over the lengths."""
    best = None
    for length in profile.buckets():
        curve = [p for p in _served_curve(profile, serving, length) if p.batch_size <= limit]
        if not curve:
            continue
        knee = _knee(curve, limit)
        if best is None or knee.batch_size > best[0].batch_size:
            best = knee, curve[-1]
    return best


def request_bytes(profile: Profile) -> int:
    """Bytes of one request's inputs at the longest measured length."""
    import numpy as np

    from latte.backend.dtypes import to_numpy

    longest = max((b for b in profile.buckets() if b is not None), default=1)
    total = 0
    for t in profile.inputs:
        dims = [longest if d == -1 else d for d in t["dims"]]
        try:
            size = np.dtype(to_numpy(t["data_type"])).itemsize
        except ValueError:  # strings: about a byte per character
            size = 1
        total += int(math.prod(dims)) * size
    return total


def shared_host_rate(rates: List[float]) -> float:
    """Requests/s of stages that each handle every request on the same cores: times per request add up."""
    return 1.0 / sum(1.0 / r for r in rates)


def bucket_edges(profile: Profile, batch_size: int) -> List[int]:
    """Sequence lengths worth their own bucket: merge neighbours whose latency is within 15%."""
    lengths = [b for b in profile.buckets() if b is not None]
    if not lengths:
        return []
    latency = {}
    for length in lengths:
        curve = profile.curve(length)
        at_or_below = [p for p in curve if p.batch_size <= batch_size] or curve[:1]
        latency[length] = at_or_below[-1].p50_ms
    edges = []
    for here, following in zip(lengths, lengths[1:]):
        if latency[following] / latency[here] >= BUCKET_SPLIT_RATIO:
            edges.append(here)
    edges.append(lengths[-1])
    return edges


def _sweep_end(profile: Profile, length: Optional[int]) -> str:
    reason = profile.stop_reason.get("fixed" if length is None else str(length))
    return f"; the profile's sweep stopped there ({reason})" if reason else ""


def derive(profile: Profile, slo_ms: float, arrival_rate: Optional[float] = None, cores: int = 1,
           gpus: int = 0, priority_levels: int = 0, serving: Optional[ServingCost] = None,
           priority_queue: str = DEFAULT_PRIORITY_QUEUE) -> Derivation:
    """Choose batching, queueing, instance and arena settings that keep P99 within slo_ms.

    serving is the cost outside the model (per batch, per request, round trip) that an
    in-process profile does not see; by default the one stored with the profile, else none.
    priority_queue says whose queue holds priority_levels > 1 (PRIORITY_QUEUES).
    """
    serving = serving or profile.serving or ServingCost()
    if min(serving.batch_ms, serving.request_ms, serving.round_trip_ms) < 0:
        raise DerivationError(f"serving costs must be >= 0, got {serving}")
    # Served latency and throughput at the longest length, the worst case the SLO is checked at.
    curve = _served_curve(profile, serving)
    if slo_ms <= 0:
        raise DerivationError(f"the SLO must be a positive number of milliseconds, got {slo_ms}")
    if arrival_rate is not None and arrival_rate <= 0:
        raise DerivationError(f"the arrival rate must be positive (requests/s), got {arrival_rate}")
    if cores < 1:
        raise DerivationError(f"cores must be >= 1, got {cores}")
    if priority_queue not in PRIORITY_QUEUES:
        raise DerivationError(f"priority_queue must be one of {', '.join(PRIORITY_QUEUES)}, got {priority_queue!r}")
    latte_queue = priority_levels > 1 and priority_queue == "latte"
    if latte_queue and priority_levels > PRIORITY_LEVELS:
        raise DerivationError(f"latte's queue has {PRIORITY_LEVELS} priority levels, and priority_levels asks for "
                              f"{priority_levels}")
    intra = profile.intra_op_threads
    use_gpu = gpus > 0 and profile.device.startswith("cuda")
    if not use_gpu and intra > cores:
        raise DerivationError(f"the profile ran with intra_op_threads={intra} but only {cores} core(s) are "
                              "available; profile again with --intra-op-threads <= cores")
    why: List[str] = []
    if serving.source != "none":
        why.append(f"latencies below are the profile's plus the {serving.describe()}")
    round_trip = serving.round_trip_ms
    latency_ms = slo_ms - round_trip      # what two batches and the queue delay may take
    worst_bucket = f" at the longest measured length {curve[0].length}" if curve[0].length is not None else ""

    first = curve[0]
    if 2 * first.p99_ms + round_trip > slo_ms:
        cost = (f" (of which {serving.batch_overhead_ms(first.batch_size):.2f} ms is serving cost outside the model)"
                if serving.source != "none" else "")
        trip = f" + {round_trip:.2f} ms client round trip" if round_trip else ""
        raise DerivationError(
            f"the SLO of {slo_ms:g} ms cannot hold: one request of batch size {first.batch_size} takes "
            f"P99 {first.p99_ms:.2f} ms{worst_bucket}{cost}, and a request arriving just after a launch waits for "
            f"that batch too (2 x {first.p99_ms:.2f} ms{trip} > {slo_ms:g} ms); relax the SLO or speed up the model")
    feasible = [p for p in curve if 2 * p.p99_ms <= latency_ms]
    top = feasible[-1]
    b, l_b = top.batch_size, top.p99_ms
    beyond = curve[curve.index(top) + 1:]
    limit_note = (f"batch {beyond[0].batch_size} would need 2 x {beyond[0].p99_ms:.2f} ms > {latency_ms:g} ms"
                  if beyond else "the largest measured batch size" + _sweep_end(profile, top.length))
    trip_note = f" less the {round_trip:.2f} ms round trip" if round_trip else ""
    why.append(f"max_batch_size {b}: the largest batch with 2 x P99 l(b) within the SLO{trip_note} "
               f"(2 x {l_b:.2f} ms = {2 * l_b:.2f} ms <= {latency_ms:g} ms{worst_bucket}; {limit_note})")

    # Instances: one per intra-op thread group that fits the cores, or as many as the rate needs.
    kind = "KIND_GPU" if use_gpu else "KIND_CPU"
    budget = gpus * 2 if use_gpu else max(1, cores // intra)
    budget_text = (f"{gpus} GPU(s) x 2 (copies overlap compute)" if use_gpu
                   else f"{cores} core(s) // intra_op_threads {intra}")
    per_instance = top.throughput
    if arrival_rate:
        needed = math.ceil(arrival_rate / (per_instance * TARGET_UTILISATION))
        count = min(max(1, needed), budget)
        why.append(f"instance count {count} ({kind}): {arrival_rate:g} req/s over {per_instance:.0f} rows/s per "
                   f"instance at {TARGET_UTILISATION:.0%} utilisation needs {needed}; the thread budget allows "
                   f"{budget} ({budget_text})")
        if needed > budget:
            why.append(f"warning: {count} instance(s) serve at most {count * per_instance:.0f} rows/s, below the "
                       f"expected {arrival_rate:g} req/s: queues will grow and requests time out; add hardware")
    else:
        count = budget
        why.append(f"instance count {count} ({kind}): no arrival rate given, so every slot of the thread budget "
                   f"is used ({budget_text}; instances x intra_op_threads <= cores)")

    # Triton 2.51 stalls a lone instance up to 500 ms behind a queue policy or priority levels
    # (docs/backend.md, Priorities); a second instance, when the budget has room, makes it rare.
    # latte's queue needs neither: Triton's queue then has no policy and passes requests on at once.
    # Without priorities Triton's queue gets no policy either: a DELAY timeout and a bounded
    # queue served 0.75-0.9x the throughput within the SLO of the same config without them
    # (the ranker, two instances; docs/benchmarks.md, Generator).
    triton_priorities = priority_levels > 1 and not latte_queue
    if triton_priorities and count < STALL_FREE_INSTANCES <= budget:
        count = STALL_FREE_INSTANCES
        why.append(f"instance count raised to {count}: with one instance Triton 2.51's batcher can sit idle "
                   "up to 500 ms behind the priority levels and queue policy below; a second instance makes that rare")
    queue_policy = triton_priorities and count >= STALL_FREE_INSTANCES
    if priority_levels > 1 and not latte_queue and count < STALL_FREE_INSTANCES:
        raise DerivationError(
            f"priority_levels {priority_levels} in Triton's queue need {STALL_FREE_INSTANCES} instances (one "
            "instance behind Triton 2.51's priority queue stalls up to 500 ms), but the thread budget allows "
            f"{budget} ({budget_text}); let latte hold the queue (priority_queue: latte), give the model more "
            "cores, or profile with fewer intra_op_threads")

    # Queue delay. While every instance is busy the queue fills by itself, so the delay only
    # acts when an instance idles; there, a batch that cannot fill waits the whole delay
    # (closed-loop clients never fill it). Waiting pays only when the arrival rate needs
    # batches larger than what forms by itself: then wait for the smallest batch b_req
    # that keeps up, as Nexus does, but never past the SLO's slack.
    slack_us = (latency_ms - 2 * l_b) * 1000.0
    if arrival_rate:
        keeping_up = [p for p in curve if p.batch_size <= b
                      and count * p.throughput * TARGET_UTILISATION >= arrival_rate]
        b_req = keeping_up[0].batch_size if keeping_up else b
        fill_us = (b_req - 1) / (arrival_rate / count) * 1e6
        fill_text = (f"batches of {b_req} keep up with {arrival_rate:g} req/s; {b_req - 1} more request(s) at "
                     f"{arrival_rate / count:g} req/s per instance take {fill_us:.0f} us")
    else:
        fill_us = 0.0
        fill_text = ("no arrival rate given: batches form from the queue that builds while instances are busy, "
                     "and waiting at an idle instance only adds latency")
    delay_us = int(max(0.0, min(slack_us, fill_us)))
    delay_text = f"min(SLO slack {latency_ms:g} ms - 2 x {l_b:.2f} ms = {slack_us:.0f} us, wait worth paying: {fill_text})"
    if latte_queue:
        # Batches form in latte's queue, so latte's window is the delay; Triton's passes requests on.
        dynamic: Dict = {"max_queue_delay_microseconds": 0}
        why.append(f"batch_window_us {delay_us}: {delay_text}; max_queue_delay_microseconds 0, so Triton hands "
                   "each request to latte's queue at once")
    else:
        dynamic = {"max_queue_delay_microseconds": delay_us}
        why.append(f"max_queue_delay_microseconds {delay_us}: {delay_text}")
        knee, knee_top = _saturation(profile, serving, b)
        at_length = "" if knee.length is None else f" at every measured length (the last to saturate: {knee.length})"
        if knee.batch_size < b and knee.throughput >= knee_top.throughput / SATURATION_GAIN:
            dynamic["preferred_batch_size"] = [knee.batch_size]
            why.append(f"preferred_batch_size [{knee.batch_size}]: throughput saturates there{at_length} "
                       f"({knee.throughput:.0f} vs {knee_top.throughput:.0f} rows/s at {b}), so launching it at "
                       "once cuts latency at no cost in throughput")
        else:
            grows = "" if knee.length is None else f" at length {knee.length}"
            why.append(f"preferred_batch_size: not set; throughput keeps improving up to max_batch_size{grows}, "
                       "and Triton would cut a deep queue's batches at a preferred size")

    if latte_queue:
        why.append(f"priority_levels {priority_levels} in latte's queue (async_execute: true): a request's parameter "
                   f"priority_level 0..{priority_levels - 1} (unmarked: 0, the lowest) decides which queued "
                   "request runs first; Triton's own priority levels would turn its prefetching off, which stalls "
                   "instances up to 500 ms in Triton 2.51")
    elif priority_levels > 1:
        dynamic["priority_levels"] = priority_levels
        dynamic["default_priority_level"] = priority_levels
        why.append(f"priority_levels {priority_levels}: requests without a priority get the lowest level "
                   f"{priority_levels}, so marked traffic overtakes them")
    else:
        why.append("priority_levels: not set; one class of traffic")

    # A request that has already waited SLO - l(b) cannot finish in time: it yields to
    # requests that still can (DELAY). Rejecting it instead fails whole clients on a
    # momentary stall (perf_analyzer aborts on the first rejection); REJECT is an override.
    # The queue holds no more requests than can be served within the SLO.
    timeout_us = int((latency_ms - l_b) * 1000.0)
    batches_in_slo = max(1, int((latency_ms - l_b) // l_b))
    queue_size = count * b * batches_in_slo
    if queue_policy:
        dynamic["default_queue_policy"] = {
            "timeout_action": "DELAY",
            "default_timeout_microseconds": timeout_us,
            "allow_timeout_override": "true",
            "max_queue_size": queue_size,
        }
        why.append(f"default_queue_policy: timeout {timeout_us} us (SLO - l(b): a request queued longer cannot "
                   f"finish in time, so it yields to requests that still can); max_queue_size {queue_size} = "
                   f"{count} instance(s) x batch {b} x {batches_in_slo} batch(es) that fit in the SLO after the first")
    elif not latte_queue:
        why.append("default_queue_policy: not set, so Triton's queue is unbounded and overload is not shed: a "
                   "timeout and a bounded queue cost 10-25 % of the throughput within the SLO (measured on the "
                   "ranker), and one instance behind a policy stalls up to 500 ms in Triton 2.51 (docs/backend.md, "
                   "Priorities); set one through overrides where shedding matters more")

    parameters = {"intra_op_threads": str(intra), "inter_op_threads": "1"}
    if latte_queue:
        parameters.update(async_execute="true", batch_window_us=str(delay_us), max_queue_size=str(b * batches_in_slo))
        why.append(f"max_queue_size {b * batches_in_slo}: latte's queue per instance holds batch {b} x "
                   f"{batches_in_slo} batch(es) that fit in the SLO after the first; a request that finds it full "
                   "takes the place of a lower priority_level's, else it is refused (UNAVAILABLE)")
    edges = bucket_edges(profile, b)
    if edges:
        parameters["bucket_edges"] = ",".join(str(e) for e in edges)
        why.append(f"bucket_edges {parameters['bucket_edges']}: measured lengths whose padding to the next one "
                   f"costs >= {BUCKET_SPLIT_RATIO - 1:.0%} more latency keep their own bucket")
    peak = max((p.peak_bytes for p in curve if p.batch_size <= b), default=0)
    arena = max(MIN_ARENA_BYTES, _round_up_pow2(peak * ARENA_HEADROOM))
    parameters["arena_bytes"] = str(arena)
    why.append(f"arena_bytes {arena}: peak {peak} bytes at batch <= {b}{worst_bucket}, +{ARENA_HEADROOM - 1:.0%}, "
               "rounded up to a power of two (the arena is a buddy allocator)")

    worst = 2 * l_b + delay_us / 1000.0 + round_trip
    throughput = count * per_instance
    ceiling = serving.request_ceiling(request_bytes(profile))
    if ceiling:
        model_only = throughput
        throughput = shared_host_rate([model_only, ceiling])
        why.append(f"throughput {throughput:.0f} requests/s: the model's {model_only:.0f} rows/s and the host's "
                   f"{ceiling:.0f} requests/s of {request_bytes(profile)} bytes for a model that computes nothing "
                   "(calibration; client and server included) share the same cores, so their times per request add up")
    planned = arrival_rate or throughput * TARGET_UTILISATION
    why.append(f"planned load {planned:.0f} req/s: " + (
        "the spec's arrival rate" if arrival_rate else
        f"{TARGET_UTILISATION:.0%} of the {throughput:.0f} rows/s the instances serve at max_batch_size "
        "(`latte verify` checks the SLO at this rate)"))
    return Derivation(max_batch_size=b, dynamic_batching=dynamic, instance_count=count, instance_kind=kind,
                      parameters=parameters, worst_case_ms=worst, throughput=throughput, planned_rate=planned,
                      slo_ms=slo_ms, explanation=why)


# Health rules `latte serve` evaluates for each model it supervises, rendered into its config's
# parameters. An execute is declared hung only far beyond anything the profile saw (a GC pause or a
# noisy neighbour must not look like a hang), and never within a few seconds.
EXECUTE_TIMEOUT_FACTOR = 50
MIN_EXECUTE_TIMEOUT_S = 5
HEALTH_P99_WINDOW_S = 120
HEALTH_CPU_PEGGED_PERCENT = 90
HEALTH_CPU_PEGGED_S = 120
REJUVENATE_MIN_INTERVAL_S = 600


def slowest_execute_ms(profile: Profile, max_batch_size: int) -> float:
    """The profiled P99 of the slowest execute a config allows: the largest batch up to
    max_batch_size (1 for a model that does not batch), at any measured length."""
    limit = max(1, max_batch_size)
    points = [p for p in profile.points if p.batch_size <= limit] or profile.points
    return max(p.p99_ms for p in points)


def health_rules(slo_ms: float, execute_p99_ms: float,
                 rss_growth_mib_per_min: Optional[float] = None) -> Dict[str, str]:
    """The model parameters of latte serve's health rules, from the SLO and the profiled P99 of
    one execute: a hang is an execute past max(5 s, 50 x that P99); a P99 above the SLO for two
    minutes, or a CPU pegged above 90 % for two minutes, reloads the model (at most once in ten
    minutes); so does resident memory growing faster than rss_growth_mib_per_min, when given."""
    if slo_ms <= 0 or execute_p99_ms <= 0:
        raise DerivationError(f"health rules need a positive SLO and execute P99, got {slo_ms} and {execute_p99_ms}")
    # Rounded first, so that float noise (50 x 0.3 s = 15.000000000000002) does not add a second.
    timeout_s = max(MIN_EXECUTE_TIMEOUT_S, math.ceil(round(EXECUTE_TIMEOUT_FACTOR * execute_p99_ms / 1000.0, 6)))
    rules = {
        "execute_timeout_s": str(timeout_s),
        "health_p99_slo_ms": f"{slo_ms:g}",
        "health_p99_window_s": str(HEALTH_P99_WINDOW_S),
        "health_cpu_pegged_percent": str(HEALTH_CPU_PEGGED_PERCENT),
        "health_cpu_pegged_s": str(HEALTH_CPU_PEGGED_S),
        "rejuvenate_min_interval_s": str(REJUVENATE_MIN_INTERVAL_S),
    }
    if rss_growth_mib_per_min is not None:
        if rss_growth_mib_per_min <= 0:
            raise DerivationError(f"health_rss_growth_mib_per_min must be > 0, got {rss_growth_mib_per_min}")
        rules["health_rss_growth_mib_per_min"] = f"{rss_growth_mib_per_min:g}"
    return rules
