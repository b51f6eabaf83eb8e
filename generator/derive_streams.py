"""A streaming model's settings from its profile and two SLOs: max_streams and
joins_per_iteration that keep time to first token (TTFT) and the inter-token latency (ITL)
within their P99 targets, at the most tokens/s.

Each iteration steps every live stream and starts those that join (docs/streaming.md), and
each output is one response through the stub (stream_cost.py). With n live streams and j
joins, an iteration computes C = step(n) + start(j) and sends S = (n + j) x response.

ITL: a stream's next output comes one iteration later, so its P99 is the P99 iteration with
the joins it may hold, and the host's tail on a stream's gaps: the echo's, measured with
m responses in each gap, grown as independent delays add, by sqrt((n + j) / m). Where the
senders are slower than the loop (S > C), the loop runs OUTBOX_ITERATIONS ahead of them, and a
newcomer, whose first output went ahead of that backlog, waits behind it for its second:
C_p99 + S + jitter x sqrt((n + j) / m), plus (OUTBOX_ITERATIONS - 1) x S when S > C, <= the
ITL SLO. (C is profiled without making responses, which the served loop also does, and S is
the echo's, which includes making them: the split moves a little, not the sum.)

TTFT: a stream that arrives waits for the iteration under way, joins in the next if it is
among the first j waiting, and its first output goes out once the joins have started (before
that iteration's step). First outputs go ahead of the running streams' outputs still waiting
to be sent (outbox.py), but where the senders are slower than the loop, the loop waits for room
before it admits anyone and the sender finishes the list under way: one more S when S > C. The
start and the server's intake under load are taken as one more iteration: served, TTFT P99
measured up to 2.5x the iteration under way plus the joins' start. So 2 x ITL_p99, plus S when
S > C, plus the round trip of a first response, <= the TTFT SLO.

Joins: each iteration, streams arrive (the spec's arrival_rate times an iteration; else, with
every stream replaced as it ends, n / tokens per stream). j covers the 99th percentile of
those arrivals (Poisson), so a stream waits one iteration at most but for the rarest bursts.

Both predictions must fit SLO_SHARE of their SLOs. Among the n measured or between them (up
to the profile's last level), the one with the most tokens/s wins; its j is then the largest
that still keeps both SLOs, so bursts clear sooner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from latte.backend.streaming.runner import OUTBOX_ITERATIONS
from latte.generator.stream_profile import ResponseCost, StreamProfile

# A profile without a measured response cost: this much per output, said in the report.
ASSUMED_RESPONSE = ResponseCost(response_ms=0.25, first_response_ms=1.0, source="assumed (not calibrated)",
                                jitter_ms=5.0)
QUANTILE = 0.99
# Predictions must fit this share of each SLO: the rest is for the host's swings that a
# profile of a few seconds does not show (as derive.py plans for 80 % utilisation).
SLO_SHARE = 0.8


class StreamDerivationError(ValueError):
    """No setting keeps the SLOs: the message says which and by how much."""


@dataclass
class StreamDerivation:
    max_streams: int
    joins_per_iteration: int
    max_tokens: int
    ttft_slo_ms: float
    itl_slo_ms: float
    ttft_p99_ms: float            # predicted
    itl_p99_ms: float             # predicted
    tokens_per_s: float           # predicted, at max_streams live
    streams_per_s: float          # streams the settings serve to the end, per second
    arrival_rate: Optional[float]
    explanation: List[str] = field(default_factory=list)

    @property
    def parameters(self) -> Dict[str, str]:
        return {"max_streams": str(self.max_streams), "joins_per_iteration": str(self.joins_per_iteration),
                "max_tokens": str(self.max_tokens)}

    def report(self, name: str) -> str:
        head = (f"{name}: max_streams {self.max_streams}, joins_per_iteration {self.joins_per_iteration}, "
                f"predicted {self.tokens_per_s:.0f} tokens/s, TTFT P99 {self.ttft_p99_ms:.1f} ms, "
                f"inter-token P99 {self.itl_p99_ms:.1f} ms")
        return head + "\n" + "\n".join(f"  - {line}" for line in self.explanation)


def poisson_quantile(mean: float, q: float = QUANTILE) -> int:
    """The smallest k with P(X <= k) >= q for X ~ Poisson(mean)."""
    if mean <= 0:
        return 0
    if mean > 100:  # exp(-mean) underflows past ~745; the normal approximation is close here
        return math.ceil(mean + 2.3263 * math.sqrt(mean))
    k, term = 0, math.exp(-mean)
    total = term
    while total < q:
        k += 1
        term *= mean / k
        total += term
    return k


def _start(profile: StreamProfile, joins: float, p99: bool) -> float:
    """The start cost of `joins` streams (fractional: the share of iterations that hold one)."""
    if joins <= 0:
        return 0.0
    point = profile.point(max(1, math.ceil(joins)))
    cost = point.start_p99_ms if p99 else point.start_mean_ms
    return cost * min(1.0, joins)


@dataclass(frozen=True)
class _Candidate:
    streams: int
    joins: int
    itl_p99_ms: float
    ttft_p99_ms: float
    tokens_per_s: float
    arrivals: float               # mean streams arriving per iteration


def _arrivals(profile: StreamProfile, response: ResponseCost, streams: int, tokens: int,
              rate: Optional[float]) -> float:
    """Mean streams arriving per iteration: the spec's rate over one iteration's steps and
    responses, else each ending stream replaced; the joins allowed do not change it."""
    if not rate:
        return streams / tokens
    return rate * (profile.point(streams).step_mean_ms + streams * response.response_ms) / 1000.0


def _candidate(profile: StreamProfile, response: ResponseCost, streams: int, joins: int, tokens: int,
               rate: Optional[float]) -> _Candidate:
    point = profile.point(streams)
    arrivals = _arrivals(profile, response, streams, tokens, rate)
    mean_iteration = (point.step_mean_ms + streams * response.response_ms + _start(profile, arrivals, False)
                      + arrivals * response.response_ms)
    compute = point.step_p99_ms + _start(profile, joins, True)
    sends = (streams + joins) * response.response_ms
    gap = compute + sends + response.jitter_ms * math.sqrt((streams + joins) / max(1, response.jitter_streams))
    behind = sends if sends > point.step_mean_ms + _start(profile, joins, False) else 0.0
    itl = gap + (OUTBOX_ITERATIONS - 1) * behind
    ttft = 2 * gap + behind + response.first_response_ms
    return _Candidate(streams, joins, itl, ttft, streams * 1000.0 / mean_iteration, arrivals)


def derive_streams(profile: StreamProfile, ttft_ms: float, itl_ms: float, max_tokens: Optional[int] = None,
                   arrival_rate: Optional[float] = None, responses: Optional[ResponseCost] = None) -> StreamDerivation:
    """The settings; StreamDerivationError when no number of streams keeps both SLOs."""
    if ttft_ms <= 0 or itl_ms <= 0:
        raise StreamDerivationError(f"the SLOs must be positive, got ttft_ms={ttft_ms} and inter_token_ms={itl_ms}")
    tokens = int(max_tokens or profile.max_tokens)
    ttft_bound, itl_bound = ttft_ms * SLO_SHARE, itl_ms * SLO_SHARE
    response = responses or profile.responses or ASSUMED_RESPONSE
    top = profile.measured_streams
    feasible: List[_Candidate] = []
    for streams in range(1, top + 1):
        needed = max(1, poisson_quantile(_arrivals(profile, response, streams, tokens, arrival_rate)))
        if needed > streams:
            continue
        least = _candidate(profile, response, streams, needed, tokens, arrival_rate)
        if least.itl_p99_ms > itl_bound or least.ttft_p99_ms > ttft_bound:
            continue
        best = least
        for joins in range(needed + 1, streams + 1):
            wider = _candidate(profile, response, streams, joins, tokens, arrival_rate)
            if wider.itl_p99_ms > itl_bound or wider.ttft_p99_ms > ttft_bound:
                break
            best = wider
        feasible.append(best)
    if not feasible:
        one = _candidate(profile, response, 1, 1, tokens, arrival_rate)
        raise StreamDerivationError(
            f"no number of live streams keeps both SLOs: even one stream's iteration predicts inter-token P99 "
            f"{one.itl_p99_ms:.2f} ms and TTFT P99 {one.ttft_p99_ms:.2f} ms, against {SLO_SHARE:.0%} of the SLOs "
            f"({itl_bound:g} and {ttft_bound:g} ms); relax the SLOs or use a faster model")
    chosen = max(feasible, key=lambda c: (round(c.tokens_per_s, 6), -c.streams))
    streams_per_s = chosen.tokens_per_s / tokens
    why = [
        f"{response.describe()}",
        f"an iteration at n streams with j joining: step(n) + start(j) + (n + j) x {response.response_ms:.3f} ms "
        f"of responses; inter-token P99 is its P99 plus the host's tail ({response.jitter_ms:.1f} ms at "
        f"{response.jitter_streams} streams, x sqrt((n + j) / {response.jitter_streams})), plus "
        f"{OUTBOX_ITERATIONS - 1} iteration's responses when the senders are slower than the loop (a "
        f"newcomer's second output waits behind them); TTFT P99 twice the gap, one iteration's responses "
        f"when the senders are slower, and "
        f"{response.first_response_ms:.2f} ms to a first response",
        f"max_streams {chosen.streams}: the most tokens/s ({chosen.tokens_per_s:.0f}) among {len(feasible)} of "
        f"1..{top} live streams whose predicted inter-token P99 and TTFT P99 ({chosen.itl_p99_ms:.2f} and "
        f"{chosen.ttft_p99_ms:.2f} ms) fit {SLO_SHARE:.0%} of the SLOs ({itl_bound:g} and {ttft_bound:g} ms), the "
        "rest left for the host's swings",
    ]
    if chosen.streams == top and top < 1024:
        why.append(f"the profile stops at {top} live streams ({profile.stop_reason}); profile more "
                   "(latte profile --streams) to consider more")
    arrivals = (f"{arrival_rate:g} streams/s arriving" if arrival_rate else
                f"each of {chosen.streams} streams replaced as it ends after {tokens} outputs")
    why.append(f"joins_per_iteration {chosen.joins}: {arrivals} brings {chosen.arrivals:.2f} per iteration on average, "
               f"{poisson_quantile(chosen.arrivals)} at P99; the largest that still keeps both SLOs, so bursts clear "
               "sooner")
    if arrival_rate and arrival_rate > streams_per_s:
        why.append(f"WARNING: {arrival_rate:g} streams/s arriving is more than the {streams_per_s:.1f} streams/s "
                   "these settings finish: streams will queue; add instances or relax the SLOs")
    return StreamDerivation(max_streams=chosen.streams, joins_per_iteration=chosen.joins, max_tokens=tokens,
                            ttft_slo_ms=ttft_ms, itl_slo_ms=itl_ms, ttft_p99_ms=chosen.ttft_p99_ms,
                            itl_p99_ms=chosen.itl_p99_ms, tokens_per_s=chosen.tokens_per_s,
                            streams_per_s=streams_per_s, arrival_rate=arrival_rate, explanation=why)
