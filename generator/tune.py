"""`latte tune`: start at the derived config and measure its neighbours on a real server.

The derivation predicts; tuning checks the prediction where it is cheapest to be wrong.
One tritonserver runs in explicit model-control mode and each candidate is loaded in
place of the model with Triton's config override, then measured:

- closed loop: concurrency doubles from the instance count until P99 passes the SLO or
  throughput stops growing; the candidate's score is its best throughput within the SLO
  (what Model Analyzer reports);
- Poisson at the planned rate (when the repository has a plan): P99 there must hold too,
  or the candidate is not eligible.

Neighbours change one setting: the queue delay, max_batch_size x2 / /2, instances +-1,
preferred batch sizes and the queue policy (delay, preferred sizes and policy are settings
Model Analyzer does not search). The search moves to the best neighbour while it beats the
incumbent by more than MIN_GAIN and stops otherwise, or when its time budget (Budget) is spent.
"""

from __future__ import annotations

import copy
import json
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from latte.generator.validate import STALL_FREE_INSTANCES

# A neighbour must beat the incumbent by this factor to be moved to (measurement noise below it).
MIN_GAIN = 1.03
# Closed-loop concurrency doubles up to this multiple of instances x max_batch_size.
CONCURRENCY_REACH = 4
MAX_STEPS = 4
# Neighbours that beat the incumbent once and are measured again, per step, at most.
CONFIRMATIONS = 2
PATIENCE = 2
# How long a measurement waits for the previous config's instances to exit.
UNLOAD_WAIT_S = 60.0


class TuneError(RuntimeError):
    """The model cannot be tuned as asked."""


class Budget:
    """The wall time a search may take: a measurement starts only when it is expected to end
    within the budget (the one running always finishes). None: no limit.

    A measurement is expected to take as long as the longest after the first: the first (the
    start) scans from one request per instance, the others from where the best so far bound,
    so it is the slowest, and it is the guess only until another is timed."""

    def __init__(self, seconds: Optional[float] = None, clock: Callable[[], float] = time.monotonic) -> None:
        if seconds is not None and not seconds > 0:
            raise TuneError(f"the time budget must be more than 0 s, got {seconds:g}")
        self.seconds = seconds
        self.clock = clock
        self.started = clock()
        self.durations: List[float] = []
        self.ran_out = False

    @property
    def expected(self) -> float:
        """How long the next measurement should take."""
        return max(self.durations[1:] or self.durations or [0.0])

    def fits(self, count: int = 1) -> bool:
        """Whether `count` more measurements would end within the budget."""
        if self.seconds is None:
            return True
        return self.clock() - self.started + count * self.expected <= self.seconds

    def allows(self, count: int = 1) -> bool:
        """fits(count), and a refusal recorded: the budget then ended the search."""
        if not self.fits(count):
            self.ran_out = True
            return False
        return True

    def timed(self, measure: Callable[["Candidate"], "Measurement"], candidate: "Candidate") -> "Measurement":
        started = self.clock()
        try:
            return measure(candidate)
        finally:
            self.durations.append(self.clock() - started)


@dataclass(frozen=True)
class Candidate:
    """The settings tuning varies; everything else stays as the repository has it."""
    instances: int
    max_batch_size: int
    delay_us: int
    preferred: Tuple[int, ...]
    queue_policy: bool          # keep the config's default_queue_policy (timeout, bounded queue)

    @property
    def label(self) -> str:
        pref = ",".join(str(b) for b in self.preferred) or "-"
        return (f"i{self.instances} b{self.max_batch_size} d{self.delay_us} pref {pref} "
                f"{'policy' if self.queue_policy else 'no-policy'}")

    @classmethod
    def of(cls, config) -> "Candidate":
        db = config.dynamic_batching
        return cls(instances=sum(g.count or 1 for g in config.instance_group) or 1,
                   max_batch_size=config.max_batch_size, delay_us=db.max_queue_delay_microseconds,
                   preferred=tuple(db.preferred_batch_size), queue_policy=db.HasField("default_queue_policy"))

    def apply(self, config):
        """A copy of config with these settings."""
        out = copy.deepcopy(config)
        out.max_batch_size = self.max_batch_size
        del out.instance_group[1:]
        if not out.instance_group:
            out.instance_group.add()
        out.instance_group[0].count = self.instances
        db = out.dynamic_batching
        db.max_queue_delay_microseconds = self.delay_us
        del db.preferred_batch_size[:]
        db.preferred_batch_size.extend(b for b in self.preferred if b <= self.max_batch_size)
        if not self.queue_policy:
            db.ClearField("default_queue_policy")
        return out


def neighbours(c: Candidate, slo_ms: float, max_instances: int, policy_available: bool = True) -> List[Candidate]:
    """Candidates one setting away from c, and the two that trade instances for batch size
    (instances x max_batch_size kept): Model Analyzer's many-instance, small-batch region,
    which no single step reaches when each step alone loses. policy_available: whether the
    repository's config has a queue policy to put back (without one, "policy" would be the
    same config measured twice)."""
    def batching(batch: int) -> dict:
        return {"max_batch_size": batch, "preferred": tuple(b for b in c.preferred if b <= batch)}

    def counted(count: int) -> dict:
        # One instance stalls behind a queue policy (Triton 2.51, docs/backend.md "Priorities"):
        # as in the derivation, it goes without one.
        return {"instances": count, "queue_policy": c.queue_policy and count >= STALL_FREE_INSTANCES}

    # The queue delay first: the derivation sets it from an arrival model (Poisson at the planned
    # rate, or none) that closed loops and bursts do not follow, while instances and batch size
    # come from the measured profile; a search cut short by its budget checks the guess first.
    slo_us = int(slo_ms * 1000)
    delays = (slo_us // 20, slo_us // 8) if c.delay_us == 0 else (0, c.delay_us // 2, c.delay_us * 2)
    out = [replace(c, delay_us=int(d)) for d in delays if d != c.delay_us and d < slo_us // 2]
    for batch in (c.max_batch_size * 2, c.max_batch_size // 2):
        if batch >= 1:
            out.append(replace(c, **batching(batch)))
    for count in (c.instances - 1, c.instances + 1):
        if 1 <= count <= max_instances:
            out.append(replace(c, **counted(count)))
    for count, batch in ((c.instances + 1, c.max_batch_size // 2), (c.instances - 1, c.max_batch_size * 2)):
        if 1 <= count <= max_instances and batch >= 1:
            out.append(replace(c, **counted(count), **batching(batch)))
    if c.preferred:
        out.append(replace(c, preferred=()))
    elif c.max_batch_size >= 4:
        out.append(replace(c, preferred=(c.max_batch_size // 2,)))
    if c.queue_policy or (policy_available and c.instances >= STALL_FREE_INSTANCES):
        out.append(replace(c, queue_policy=not c.queue_policy))
    return list(dict.fromkeys(out))


@dataclass
class Measurement:
    candidate: Candidate
    score: float = 0.0                       # best closed-loop infer/s with P99 <= SLO
    p99_ms: float = 0.0                      # P99 at that level
    concurrency: int = 0
    poisson_p99_ms: Optional[float] = None   # P99 at the planned rate
    error: Optional[str] = None              # refused at load, or failed to measure
    rows: List[dict] = field(default_factory=list)
    scores: List[float] = field(default_factory=list)   # every measurement's score, when measured more than once

    def joined(self, again: "Measurement") -> "Measurement":
        """This candidate measured twice or more: the mean score, the worse P99s, every row."""
        if again.error is not None or self.error is not None:
            return again if again.error is not None else self
        scores = (self.scores or [self.score]) + [again.score]
        poisson = [p for p in (self.poisson_p99_ms, again.poisson_p99_ms) if p is not None]
        return replace(self, score=sum(scores) / len(scores), scores=scores, p99_ms=max(self.p99_ms, again.p99_ms),
                       poisson_p99_ms=max(poisson) if poisson else None, rows=self.rows + again.rows)

    def holds_rate(self, slo_ms: float) -> bool:
        """P99 within the SLO at the planned rate (or no planned rate to hold)."""
        return self.poisson_p99_ms is None or self.poisson_p99_ms <= slo_ms

    def eligible(self, slo_ms: float, rate_check: bool = True) -> bool:
        return self.error is None and self.score > 0 and (not rate_check or self.holds_rate(slo_ms))

    def to_json(self) -> dict:
        data = asdict(self)
        data["candidate"] = {**asdict(self.candidate), "label": self.candidate.label}
        return data


def pick_next(best: Measurement, measured: List[Measurement], slo_ms: float,
              rate_check: bool = True) -> Optional[Measurement]:
    """The neighbour to move to, or None when none beats best by more than MIN_GAIN."""
    better = [m for m in measured if m.eligible(slo_ms, rate_check) and m.score > best.score * MIN_GAIN]
    return max(better, key=lambda m: m.score) if better else None


def rate_reachable(measured, slo_ms: float) -> bool:
    """Whether any candidate measured holds the planned rate. When none does, the plan asked for
    more than this model serves here: the rate check cannot tell candidates apart, and they are
    ranked by closed-loop throughput within the SLO alone (as Model Analyzer ranks)."""
    return any(m.eligible(slo_ms) for m in measured)


def describe_requests(config, length: int, lengths=None) -> str:
    """What the measurements sent, kept with them."""
    if not any(-1 in t.dims for t in config.input):
        return "fixed shapes"
    if lengths is None:
        return f"every variable dimension at {length}"
    params = ",".join(f"{k}={v}" for k, v in lengths.params)
    return f"lengths drawn from {lengths.kind}" + (f":{params}" if params else "")


@dataclass
class TuneResult:
    model: str
    slo_ms: float
    start: Measurement
    best: Measurement
    measurements: List[Measurement]
    wall_s: float
    requests: str = ""     # what the measurements sent (describe_requests)
    budget_s: Optional[float] = None   # the time budget, when one was set
    out_of_budget: bool = False        # whether the search stopped because it was spent

    @property
    def rate_checked(self) -> bool:
        """Whether candidates had to hold the planned rate (see rate_reachable)."""
        return rate_reachable(self.measurements, self.slo_ms)

    @property
    def found(self) -> bool:
        """Whether the winner serves within the SLO (and holds the planned rate where any candidate does)."""
        return self.best.eligible(self.slo_ms, self.rate_checked)

    def table(self) -> str:
        lines = [f"{'candidate':<36} {'infer/s':>9} {'P99 ms':>8} {'at conc':>7} {'Poisson P99':>11}  note"]
        for m in sorted(self.measurements, key=lambda m: -m.score):
            poisson = "-" if m.poisson_p99_ms is None else f"{m.poisson_p99_ms:.2f}"
            note = ("winner" if m is self.best else "start" if m is self.start else "") or \
                (m.error or ("" if m.eligible(self.slo_ms, self.rate_checked) else "misses the SLO"))
            lines.append(f"{m.candidate.label:<36} {m.score:>9.0f} {m.p99_ms:>8.2f} {m.concurrency:>7} "
                         f"{poisson:>11}  {note}")
        gain = self.best.score / self.start.score if self.start.score else float("inf")
        lines.append(f"{self.model}: {len(self.measurements)} candidate(s) in {self.wall_s:.0f} s"
                     + (f" ({self.requests})" if self.requests else "") + f"; winner "
                     f"{self.best.candidate.label} at {self.best.score:.0f} infer/s ({gain:.2f}x the start)")
        if self.out_of_budget:
            lines.append(f"{self.model}: stopped when its {self.budget_s:g} s budget was spent: neighbours not "
                         "measured by then are not ranked, and a win not yet measured twice was not moved to")
        if not self.rate_checked and any(m.poisson_p99_ms is not None for m in self.measurements):
            lines.append(f"{self.model}: no candidate held P99 <= {self.slo_ms:g} ms at the planned rate; ranked by "
                         "closed-loop throughput within the SLO alone: plan a lower arrival_rate")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"model": self.model, "slo_ms": self.slo_ms, "wall_s": self.wall_s, "requests": self.requests,
                "start": self.start.candidate.label, "winner": self.best.candidate.label,
                "rate_checked": self.rate_checked, "budget_s": self.budget_s, "out_of_budget": self.out_of_budget,
                "measurements": [m.to_json() for m in self.measurements]}


def search(start: Candidate, measure: Callable[[Candidate], Measurement], slo_ms: float, max_instances: int,
           max_steps: int = MAX_STEPS, log: Callable[[str], None] = lambda line: None,
           budget: Optional[Budget] = None) -> Tuple[Measurement, Measurement, List[Measurement]]:
    """Hill-climb from start; returns (start's measurement, the best, every measurement).

    A neighbour that beats the incumbent is measured again, and the incumbent with it, and the
    search moves only if it wins that new pair too: on a small host one config's throughput
    within the SLO spreads by up to a quarter between measurements, and a climb on single
    figures follows the noise. A candidate measured more than once scores (in the table) the
    mean of its measurements. Under a budget (start is always measured), a measurement starts
    only when it should end in time; once a neighbour has won, the next one starts only when
    the confirming pair would still fit after it; where the rest of the neighbourhood and a pair
    would not fit, a win is confirmed as soon as it is measured; and no win is moved to
    unconfirmed."""
    seen: Dict[Candidate, Measurement] = {}
    policy_available = start.queue_policy
    budget = budget or Budget()

    def get(c: Candidate, then: int = 0) -> Optional[Measurement]:
        """c's measurement, or None when it and `then` more would not end within the budget."""
        if c not in seen:
            if seen and not budget.allows(1 + then):
                return None
            seen[c] = budget.timed(measure, c)
            m = seen[c]
            log(f"  {c.label}: " + (m.error or f"{m.score:.0f} infer/s within {slo_ms:g} ms"))
        return seen[c]

    def again(c: Candidate) -> Measurement:
        seen[c] = seen[c].joined(budget.timed(measure, c))
        m = seen[c]
        log(f"  {c.label}, again: " + (m.error or f"{m.score:.0f} infer/s within {slo_ms:g} ms (mean of "
                                         f"{', '.join(f'{s:.0f}' for s in m.scores)})"))
        return m

    def confirmed(incumbent: Measurement, step: List[Measurement], check: bool, tried: set) -> Optional[Measurement]:
        """The best neighbour that still beats the incumbent once both are measured again; of
        those that beat it once, the best CONFIRMATIONS a step are tried (`tried` holds them)."""
        while len(tried) < CONFIRMATIONS:
            challenger = pick_next(incumbent, [seen[m.candidate] for m in step if m.candidate not in tried],
                                   slo_ms, check)
            if challenger is None:
                return None
            tried.add(challenger.candidate)
            if not budget.allows(2):  # out of time: a win measured once does not count
                return None
            incumbent = again(incumbent.candidate)
            challenger = again(challenger.candidate)
            # Decided on the new pair alone: the first figure won among many, so it is biased up.
            if challenger.eligible(slo_ms, check) and challenger.scores[-1] > incumbent.scores[-1] * MIN_GAIN:
                return challenger
        return None

    first = best = get(start)
    warned = False
    for _ in range(max_steps):
        step: List[Measurement] = []
        tried: set = set()
        moved: Optional[Measurement] = None
        candidates = neighbours(best.candidate, slo_ms, max_instances, policy_available)
        for index, c in enumerate(candidates):
            check = rate_reachable(seen.values(), slo_ms)
            untried = [m for m in step if m.candidate not in tried]
            # A win waiting to be confirmed keeps room in the budget for the pair measured again.
            waiting = best.eligible(slo_ms, check) and pick_next(best, untried, slo_ms, check) is not None
            m = get(c, then=2 if waiting else 0)
            if m is None:
                break
            step.append(m)
            # Where the budget cannot measure the rest of the neighbourhood and then a pair, a
            # win is confirmed at once: waiting for a better one spends the room its pair needs.
            left = len(candidates) - index - 1
            if (best.eligible(slo_ms, check) and pick_next(best, [m], slo_ms, check) is not None
                    and not budget.fits(left + 2)):
                moved = confirmed(best, [m], check, tried)
                best = seen[best.candidate]
                if moved is not None or budget.ran_out:
                    break
        if moved is not None:
            best = moved
            continue
        check = rate_reachable(seen.values(), slo_ms)
        if not check and not warned:
            warned = True
            log("  no candidate holds the planned rate at P99 within the SLO: ranking by closed-loop throughput "
                "within the SLO alone (the plan asks for more than this model serves here)")
        if not best.eligible(slo_ms, check):
            # The incumbent misses: any eligible neighbour is progress.
            best = max((m for m in step if m.eligible(slo_ms, check)), key=lambda m: m.score, default=best)
            if not best.eligible(slo_ms, check) or budget.ran_out:
                break
            continue
        following = confirmed(best, step, check, tried)
        best = seen[best.candidate]
        if following is None:
            break
        best = following
        if budget.ran_out:
            break
    check = rate_reachable(seen.values(), slo_ms)
    if not best.eligible(slo_ms, check):
        # Measured again, the incumbent can miss where it held once (P99 at a planned rate near
        # saturation swings widely): the winner is then the best candidate that holds.
        best = max((m for m in seen.values() if m.eligible(slo_ms, check)), key=lambda m: m.score, default=best)
    return seen[first.candidate], best, list(seen.values())


def closed_loop_scan(run, slo_ms: float, first_level: int, last_level: int,
                     start_level: Optional[int] = None) -> Tuple[float, float, int, List[dict]]:
    """Best throughput within the SLO as concurrency doubles from first_level up to last_level;
    (score, its P99, its level, rows). What Model Analyzer reports for a config, and the only
    figure that says where the SLO binds.

    The scan ends when P99 passes the SLO, when the server rejects requests (a full queue),
    or after PATIENCE doublings without a gain of MIN_GAIN (one is noise on a busy host).
    With start_level (above first_level) it begins there instead, where a similar config's SLO
    bound, and where that level already misses the SLO, halves down to first_level until a
    level holds it: the levels far below the binding one cost a measurement each and rank nothing.

    Where a level misses right above one that held, the level midway between them is measured
    once too: a doubling is a coarse step where the SLO binds (a config whose P99 at 128 in
    flight hovers at the SLO scores 64's throughput or 128's by chance, a quarter apart), and
    Model Analyzer's own search bisects there."""
    from latte.triton.perf import PerfAnalyzerError

    best, best_p99, best_level, rows, stale = 0.0, 0.0, 0, [], 0
    first_level = max(1, first_level)
    level = first_level if start_level is None else min(max(first_level, start_level), last_level)
    descending = level > first_level
    missed = None     # the level that missed right above the last one that held

    def holding(level: int):
        """The point at level when it holds the SLO, else None (the row is kept either way)."""
        try:
            point = run(concurrency=[level])
        except PerfAnalyzerError as exc:
            if not rows and not descending:
                raise
            rows.append({"concurrency": level, "error": str(exc).splitlines()[-1][:120]})
            return None
        rows.append({"concurrency": level, "throughput": point.throughput, "p99_ms": point.p99_ms})
        return point if point.p99_ms <= slo_ms else None

    while first_level <= level <= last_level:
        point = holding(level)
        if point is None:
            missed = level
            if descending:
                level //= 2
                continue
            break
        if descending and len(rows) > 1:   # the levels above this one missed: it is the best
            best, best_p99, best_level = point.throughput, point.p99_ms, level
            break
        descending = False
        stale = 0 if point.throughput > best * MIN_GAIN else stale + 1
        if point.throughput > best:
            best, best_p99, best_level = point.throughput, point.p99_ms, level
        if stale >= PATIENCE:
            missed = None
            break
        level *= 2
    middle = None if missed is None else (missed // 2 + missed) // 2
    if best > 0 and middle is not None and missed // 2 < middle < missed:
        point = holding(middle)
        if point is not None and point.throughput > best:
            best, best_p99, best_level = point.throughput, point.p99_ms, middle
    return best, best_p99, best_level, rows


def _closed_loop(run, candidate: Candidate, slo_ms: float,
                 start_level: Optional[int] = None) -> Tuple[float, float, int, List[dict]]:
    """closed_loop_scan for a candidate: from one request per instance (or start_level) to
    CONCURRENCY_REACH times what its instances batch at once."""
    return closed_loop_scan(run, slo_ms, candidate.instances,
                            CONCURRENCY_REACH * candidate.instances * max(1, candidate.max_batch_size),
                            start_level)


def settle(instances_now: Callable[[], int], instances: int, timeout_s: float = UNLOAD_WAIT_S,
           sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> bool:
    """Wait until no more than `instances` instances run: a reload brings the candidate's
    instances up before the previous config's are gone, and a stub still unloading takes CPU
    from the one measured. False when they had not gone after timeout_s."""
    deadline = clock() + timeout_s
    while instances_now() > instances:
        if clock() >= deadline:
            return False
        sleep(0.1)
    return True


def tune(repo: Path, model: str, slo_ms: Optional[float] = None, install=None, length: int = 16,
         measurement_ms: int = 1000, max_steps: int = MAX_STEPS, write: bool = True,
         log: Callable[[str], None] = lambda line: None, lengths=None,
         budget_s: Optional[float] = None) -> TuneResult:
    """Search MODEL's neighbourhood in REPO; write the winner's config.pbtxt when write is set.
    Requests have every variable dimension at `length`, or lengths drawn from the
    LengthDistribution `lengths` (what the model will serve: padding and batch planning then
    cost what they cost in production). With budget_s, a measurement starts only when it should
    end within that many seconds of the call (the server's start included; see Budget)."""
    import tritonclient.grpc as grpcclient
    from google.protobuf import json_format, text_format
    from tritonclient.utils import InferenceServerException

    from latte.generator.operating_point import read_operating_points
    from latte.backend.config import usable_cores
    from latte.bench.cpu import model_stub_pids
    from latte.generator.validate import batcher_stall, validate_repository
    from latte.generator.verify import request_samples
    from latte.triton import TritonServer
    from latte.triton.perf import PerfAnalyzerError, run_perf_analyzer, write_input_data

    budget = Budget(budget_s)  # a wrong budget is refused before anything starts
    repo = Path(repo)
    configs = validate_repository(repo)
    if model not in configs:
        raise TuneError(f"model {model!r} is not in {repo} (models: {', '.join(sorted(configs))})")
    config = configs[model]
    if config.platform == "ensemble" or config.backend != "latte":
        raise TuneError(f"{model} is not a latte model; tune the latte step of an ensemble by its own name")
    if not config.HasField("dynamic_batching") or config.max_batch_size < 1:
        raise TuneError(f"{model} does not batch (no dynamic_batching or max_batch_size 0): nothing to tune")
    plan = read_operating_points(repo).get(model)
    slo_ms = slo_ms if slo_ms is not None else (plan.slo_ms if plan else None)
    if slo_ms is None or slo_ms <= 0:
        raise TuneError(f"give a positive --slo-ms: {repo} has no plan from `latte generate` naming {model}'s SLO")
    cores = usable_cores()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="latte-tune-") as tmp, TritonServer(
            repo, install=install, log_path=Path(tmp) / "tritonserver.log",
            extra_args=["--model-control-mode=explicit", f"--load-model={model}"]) as server:
        data = write_input_data(Path(tmp) / "inputs.json", request_samples(config, length, lengths))
        client = grpcclient.InferenceServerClient(server.grpc_url)
        leader = Measurement(Candidate.of(config))     # the best score measured so far, and its level

        def measure(candidate: Candidate) -> Measurement:
            m = Measurement(candidate)
            applied = candidate.apply(config)
            if batcher_stall(applied) is not None:  # measured, it would score the stall, not the settings
                m.error = "not measured: one instance behind priority levels or a queue policy stalls in Triton 2.51"
                return m
            try:
                client.load_model(model, config=json_format.MessageToJson(applied, preserving_proto_field_name=True))
            except InferenceServerException as exc:
                m.error = "refused at load: " + str(exc.message() or exc).splitlines()[0][:120]
                return m
            if not settle(lambda: len(model_stub_pids(server.process.pid, model)), candidate.instances):
                log(f"  {candidate.label}: the previous config's instances were still running after "
                    f"{UNLOAD_WAIT_S:.0f} s; measuring beside them")

            def run(**load):
                # A wide stability band: a busy host must not abort a candidate; MIN_GAIN absorbs the noise.
                return run_perf_analyzer(model, server.grpc_url, input_data=data, measurement_ms=measurement_ms,
                                         max_trials=8, stability_percentage=100.0, **load)[0]
            # Neighbours bind near where the best so far did: the scan starts there, and halves
            # from there when that level misses.
            start_level = leader.concurrency if leader.score > 0 else None
            try:
                m.score, m.p99_ms, m.concurrency, m.rows = _closed_loop(run, candidate, slo_ms, start_level)
            except PerfAnalyzerError as exc:
                m.error = "failed: " + str(exc).splitlines()[-1][:120]
                return m
            if m.score > leader.score:
                leader.score, leader.concurrency = m.score, m.concurrency
            if plan is not None:
                try:
                    m.poisson_p99_ms = run(request_rate=[round(plan.rate, 1)],
                                           extra_args=["--request-distribution", "poisson", "--async"]).p99_ms
                except PerfAnalyzerError:
                    m.poisson_p99_ms = float("inf")  # rejected at the planned rate: it cannot hold there
            return m

        first, best, measured = search(Candidate.of(config), measure, slo_ms, max_instances=2 * cores,
                                       max_steps=max_steps, log=log, budget=budget)
    result = TuneResult(model, slo_ms, first, best, measured, time.perf_counter() - started,
                        requests=describe_requests(config, length, lengths), budget_s=budget_s,
                        out_of_budget=budget.ran_out)
    if write and best.candidate != first.candidate and result.found:
        (repo / model / "config.pbtxt").write_text(text_format.MessageToString(best.candidate.apply(config)))
    record = Path(plan.profile).with_suffix(".tune.json") if plan and plan.profile else repo / f"{model}.tune.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(result.to_json(), indent=2) + "\n")
    log(f"measurements kept in {record}")
    return result
