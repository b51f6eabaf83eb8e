"""The supervisor: one loop that watches every model's processes and acts.

Each step reads the world (the server's stub processes, the models' flight files, their
figures), decides (a death, a hang, a rule tripped, a restart due), and hands reloads to a
worker pool; the reloads' outcomes come back through a queue the next step reads. Nothing else
changes a model's record, and everything the endpoint shows is a snapshot taken under its lock.
"""

from __future__ import annotations

import concurrent.futures
import os
import queue
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional, Set

from latte.supervision import processes, state
from latte.supervision.flight import longest_running_s, read_flights
from latte.supervision.policy import RestartBudget, RestartPolicy
from latte.supervision.poison import REFUSE_AFTER, PoisonList
from latte.supervision.repository import LoadOutcome, TritonRepository
from latte.supervision.rules import DEFAULT_EXECUTE_TIMEOUT_S, HealthRules, Vitals
from latte.supervision.vitals_metrics import read_model_metrics

SERVING, RESTARTING, DOWN = "serving", "restarting", "down"
REASONS = ("died", "hung", "rejuvenated", "gave_up")
# The loop counts as stuck (liveness fails) when its last step is older than this.
STUCK_AFTER_S = 15.0
PROCESS_SAMPLE_S = 1.0
EXIT_WATCH_S = 0.02
METRICS_SAMPLE_S = 5.0


@dataclass
class ModelRecord:
    name: str
    config: dict
    rules: HealthRules
    budget: RestartBudget
    status: str = SERVING
    reason: str = ""
    since: float = field(default_factory=time.time)
    generation: int = 0
    pids: Dict[int, processes.StubProcess] = field(default_factory=dict)
    retiring: Set[int] = field(default_factory=set)   # the replaced copy's processes, exiting on purpose
    restart_due: Optional[float] = None
    cause: str = ""                                   # died or hung: what the pending restart answers
    reloading: Optional[str] = None                   # the reason of the reload in flight
    last_rejuvenation: float = float("-inf")
    vitals: Optional[Vitals] = None


class Outcome(NamedTuple):
    model: str
    reason: str        # died, hung or rejuvenated
    result: LoadOutcome
    seconds: float


class ModelView(NamedTuple):
    status: str
    reason: str
    since: float
    restarts_in_window: int


class Snapshot(NamedTuple):
    models: Dict[str, ModelView]
    restarts: Dict[tuple, int]     # (model, reason) -> count
    last_step_age_s: float
    server_alive: bool
    server_restarts: int = 0       # tritonserver itself started again after it exited

    @property
    def ready(self) -> bool:
        return self.server_alive and self.last_step_age_s < STUCK_AFTER_S and \
            all(v.status == SERVING for v in self.models.values())

    @property
    def live(self) -> bool:
        return self.server_alive and self.last_step_age_s < STUCK_AFTER_S and \
            all(v.status != DOWN for v in self.models.values())


class Supervisor:
    def __init__(self, server, policy: RestartPolicy = RestartPolicy(), state_dir: Optional[Path] = None,
                 execute_timeout_s: Optional[float] = None, tick_s: float = 0.2,
                 log: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic,
                 restarts: Optional[Dict[tuple, int]] = None, server_restarts: int = 0) -> None:
        self.server = server
        self.policy = policy
        self.state_dir = Path(state_dir) if state_dir else None
        self.execute_timeout_s = execute_timeout_s
        self.tick_s = tick_s
        self._log = log
        self._clock = clock
        self.repository = TritonRepository(server.http_url, server.admin_headers())
        self.models: Dict[str, ModelRecord] = {}
        # Counted across tritonserver's own restarts (a new supervisor takes the last one's counts).
        self._restarts: Dict[tuple, int] = dict(restarts or {})
        self.server_restarts = server_restarts
        self._outcomes: "queue.Queue[Outcome]" = queue.Queue()
        self._requests: "queue.Queue[tuple]" = queue.Queue()   # (model, why) rejuvenations asked for
        self._hung: Dict[int, str] = {}                           # pid -> what the hang was
        self._exits: Dict[int, int] = {}                          # pid -> its exit status, once seen
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="latte-reload")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._last_step = clock()
        self._last_process_sample = float("-inf")
        self._last_metrics_sample = float("-inf")

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "Supervisor":
        for name in self.repository.ready_models():
            config = self.repository.config(name)
            if config.get("platform") == "ensemble":
                continue  # an ensemble has no process of its own; its steps are supervised
            rules = HealthRules.of(name, config, self.execute_timeout_s or DEFAULT_EXECUTE_TIMEOUT_S)
            self.models[name] = ModelRecord(name, config, rules, RestartBudget(self.policy), vitals=Vitals(rules))
        stubs = processes.live_stubs(self.server.process.pid)
        for pid, stub in stubs.items():
            if stub.model in self.models:
                self.models[stub.model].pids[pid] = stub
        self._last_step = self._clock()
        self._thread = threading.Thread(target=self._run, name="latte-supervisor", daemon=True)
        self._thread.start()
        self._exits_thread = threading.Thread(target=self._watch_exits, name="latte-exits", daemon=True)
        self._exits_thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _watch_exits(self) -> None:
        """Read each known process's state every EXIT_WATCH_S: a dead stub's exit status is in
        /proc only until the server reaps it, which it may do at the next request it sends it."""
        while not self._stop.wait(EXIT_WATCH_S):
            with self._lock:
                pids = [pid for record in self.models.values() for pid in record.pids if pid not in self._exits]
            for pid in pids:
                found = processes.process_state(pid)
                if not found.alive and found.exit_status is not None:
                    with self._lock:
                        self._exits[pid] = found.exit_status

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as exc:  # the loop must outlive one bad step; the log says why
                self._log(f"latte supervisor: a step failed: {type(exc).__name__}: {exc}")
            self._stop.wait(self.tick_s)

    # --- what others may ask -------------------------------------------------------------------
    def rejuvenate(self, model: str, why: str = "asked for") -> bool:
        """Ask for a rejuvenation of `model` at the next step; False for a model not supervised."""
        if model not in self.models:
            return False
        self._requests.put((model, why, True))
        return True

    def snapshot(self) -> Snapshot:
        now = self._clock()
        with self._lock:
            views = {name: ModelView(r.status, r.reason, r.since, r.budget.used(now))
                     for name, r in self.models.items()}
            # A stopped supervisor vouches for nothing: the server it watched may be another run now.
            watching = self.server.is_alive() and not self._stop.is_set()
            return Snapshot(views, dict(self._restarts), now - self._last_step, watching, self.server_restarts)

    @property
    def restarts(self) -> Dict[tuple, int]:
        with self._lock:
            return dict(self._restarts)

    # --- one step --------------------------------------------------------------------------------
    def step(self) -> None:
        now = self._clock()
        if not self.server.is_alive():
            # Its models went with it: readiness and liveness say so, and there is nothing to reload.
            self._last_step = now
            return
        stubs = processes.live_stubs(self.server.process.pid)
        with self._lock:
            self._take_outcomes(now)
            by_model: Dict[str, Dict[int, processes.StubProcess]] = {}
            for pid, stub in stubs.items():
                by_model.setdefault(stub.model, {})[pid] = stub
            for record in self.models.values():
                self._watch(record, by_model.get(record.name, {}), now)
            self._check_hangs(now)
            self._judge_health(now)
            self._take_requests(now)
            for record in self.models.values():
                if record.restart_due is not None and now >= record.restart_due and record.reloading is None:
                    self._reload(record, record.cause, now)
            self._last_step = now

    def _watch(self, record: ModelRecord, live: Dict[int, processes.StubProcess], now: float) -> None:
        if record.reloading is not None or record.status == DOWN:
            return
        # The replaced copy's processes exit on purpose, before or after the reload's outcome is taken.
        dead = [pid for pid in record.pids if pid not in live and pid not in record.retiring]
        if dead and record.status == SERVING:
            self._died(record, dead, now)
        record.retiring &= set(live)
        record.pids = {pid: stub for pid, stub in live.items() if pid not in record.retiring}

    def _died(self, record: ModelRecord, dead: List[int], now: float) -> None:
        hung = [self._hung.pop(pid) for pid in dead if pid in self._hung]
        cause = "hung" if hung else "died"
        statuses = {pid: self._exits.pop(pid, None) for pid in dead}
        statuses = {pid: status if status is not None else processes.process_state(pid).exit_status
                    for pid, status in statuses.items()}
        exits = ", ".join(f"{record.pids[pid].instance} (pid {pid}) {processes.describe_exit(statuses[pid])}"
                          for pid in dead)
        detail = f"{hung[0]}; " if hung else ""
        # A kill from outside (the OOM killer, an operator) says nothing of the inputs in flight;
        # a crash of the process's own making or a hang does.
        blamed = [pid for pid in dead if hung or processes.blames_input(statuses[pid])]
        self._journal_crash(record, blamed)
        for pid in set(dead) - set(blamed):
            self._forget_flights(record, pid)
        record.cause = cause
        self._schedule_restart(record, f"{cause}: {detail}{exits}", now)

    def _schedule_restart(self, record: ModelRecord, why: str, now: float) -> None:
        delay = record.budget.next_delay(now)
        if delay is None:
            self._give_up(record, why, now)
            return
        self._set(record, RESTARTING, why)
        record.restart_due = now + delay
        used = record.budget.used(now) + 1
        self._event(record.name, f"{why}; restarting {'now' if delay == 0 else f'in {delay:g} s'} "
                                 f"(restart {used} of {self.policy.max_restarts} in {self.policy.window_s:g} s)")

    def _give_up(self, record: ModelRecord, why: str, now: float) -> None:
        self._set(record, DOWN, f"gave up after {self.policy.max_restarts} restarts in "
                                f"{self.policy.window_s:g} s; last: {why}")
        record.restart_due = None
        self._count(record.name, "gave_up")
        self._event(record.name, f"{record.reason}; it stays down until loaded again "
                                 f"(POST /v2/repository/models/{record.name}/load)")
        self._pool.submit(self.repository.unload, record.name)

    def _journal_crash(self, record: ModelRecord, dead: List[int]) -> None:
        """The inputs the dead processes were running count one crash each; their files go."""
        if self.state_dir is None:
            return
        batches = []
        for pid in dead:
            path = state.flight_path(self.state_dir, record.name, record.pids[pid].instance, pid)
            batches += [flight.digests for flight in read_flights(path) if flight.digests]
            path.unlink(missing_ok=True)
        if batches:
            newly = PoisonList(state.poison_path(self.state_dir, record.name)).record_crash(batches)
            if newly:
                self._event(record.name, f"{len(newly)} input(s) were in flight at {REFUSE_AFTER} of its crashes, "
                                         "alone in a batch at one; they are refused from now on")

    def _forget_flights(self, record: ModelRecord, pid: int) -> None:
        if self.state_dir is not None:
            state.flight_path(self.state_dir, record.name, record.pids[pid].instance, pid).unlink(missing_ok=True)

    def _check_hangs(self, now: float) -> None:
        if self.state_dir is None:
            return
        for record in self.models.values():
            if record.status != SERVING or record.reloading is not None:
                continue
            for pid, stub in record.pids.items():
                if pid in self._hung:
                    continue
                ran = longest_running_s(read_flights(state.flight_path(self.state_dir, record.name,
                                                                       stub.instance, pid)))
                if ran > record.rules.execute_timeout_s:
                    self._hung[pid] = (f"an execute ran {ran:.1f} s, past its limit of "
                                       f"{record.rules.execute_timeout_s:g} s")
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass

    def _judge_health(self, now: float) -> None:
        if now - self._last_process_sample >= PROCESS_SAMPLE_S:
            self._last_process_sample = now
            for record in self.models.values():
                if record.status == SERVING and record.reloading is None and record.pids:
                    record.vitals.sample_process(now, sum(processes.rss_bytes(p) for p in record.pids),
                                                 sum(processes.cpu_seconds(p) for p in record.pids))
        if now - self._last_metrics_sample >= METRICS_SAMPLE_S:
            self._last_metrics_sample = now
            self._sample_metrics(now)
        for record in self.models.values():
            if record.status != SERVING or record.reloading is not None:
                continue
            why = record.vitals.verdict(now)
            if why and now - record.last_rejuvenation >= record.rules.rejuvenate_min_interval_s:
                self._requests.put((record.name, why, False))

    def _sample_metrics(self, now: float) -> None:
        wanted = [r for r in self.models.values() if r.rules.p99_slo_ms is not None or r.rules.fragmented_s]
        if not wanted:
            return
        figures = read_model_metrics(self.server.metrics_url)
        if figures is None:
            return
        for record in wanted:
            latency, fragmented = figures.get(record.name, (None, None))
            record.vitals.sample_metrics(now, latency, fragmented)

    def _take_requests(self, now: float) -> None:
        while True:
            try:
                model, why, asked = self._requests.get_nowait()
            except queue.Empty:
                return
            record = self.models.get(model)
            if record is None or record.status != SERVING or record.reloading is not None:
                continue
            if not asked and now - record.last_rejuvenation < record.rules.rejuvenate_min_interval_s:
                continue
            record.last_rejuvenation = now
            self._event(model, f"rejuvenating: {why}; a new copy loads while this one serves")
            self._reload(record, "rejuvenated", now)

    # --- reloads -----------------------------------------------------------------------------------
    def _reload(self, record: ModelRecord, reason: str, now: float) -> None:
        record.generation += 1
        record.reloading = reason
        record.restart_due = None
        record.retiring |= set(record.pids)
        if reason != "rejuvenated":
            record.budget.spend(now)
            self._count(record.name, reason)
        config, generation, name = record.config, record.generation, record.name

        def work() -> None:
            started = time.monotonic()
            result = self.repository.reload(name, config, generation)
            self._outcomes.put(Outcome(name, reason, result, time.monotonic() - started))

        self._pool.submit(work)

    def _take_outcomes(self, now: float) -> None:
        while True:
            try:
                outcome = self._outcomes.get_nowait()
            except queue.Empty:
                return
            record = self.models[outcome.model]
            record.reloading = None
            record.vitals = Vitals(record.rules)
            if outcome.result.ok:
                if outcome.reason == "rejuvenated":
                    self._count(record.name, outcome.reason)
                self._set(record, SERVING, "")
                self._event(record.name, f"serving again: {outcome.reason} copy replaced in {outcome.seconds:.1f} s"
                            if outcome.reason != "rejuvenated" else f"rejuvenated in {outcome.seconds:.1f} s")
            elif outcome.reason == "rejuvenated":
                record.retiring.clear()  # the copy it was to replace serves on, and is watched
                self._event(record.name, f"rejuvenation failed, the serving copy stays: {outcome.result.error}")
            else:
                self._schedule_restart(record, f"{record.cause}: the new copy failed to load: "
                                               f"{outcome.result.error}", now)

    # --- records and events ----------------------------------------------------------------------
    def _set(self, record: ModelRecord, status: str, reason: str) -> None:
        if record.status != status:
            record.since = time.time()
        record.status, record.reason = status, reason

    def _count(self, model: str, reason: str) -> None:
        self._restarts[(model, reason)] = self._restarts.get((model, reason), 0) + 1

    def _event(self, model: str, text: str) -> None:
        self._log(f"latte supervisor: model '{model}' {' '.join(text.split())}")

    @property
    def dead_copies(self) -> int:
        """Copies replaced after their process died or hung: Triton 2.51 keeps them, unloading,
        until it stops."""
        with self._lock:
            return sum(n for (_, reason), n in self._restarts.items() if reason in ("died", "hung"))
