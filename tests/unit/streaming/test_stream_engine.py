"""The streaming engine on a small counting model (counting_stream.py), driven an iteration at
a time: streams join and leave mid-batch, fail alone, are cancelled, run short of cache, and
give back every block."""

import collections

import numpy as np
import pytest

from counting_stream import counting_runner, write_counting_stream
from latte.backend.errors import DeadlineExceeded, ModelError, OutOfMemory, RequestCancelled, RequestError
from latte.backend.options import RequestOptions
from latte.backend.streaming.controls import StreamControls
from latte.backend.streaming.streams import Stream


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return write_counting_stream(tmp_path_factory.mktemp("counting"), max_tokens=256)


def stream(x, max_tokens=8, arrival=0.0, stream=True, **options):
    controls = StreamControls(stream=stream, max_tokens=max_tokens, options=RequestOptions(**options))
    return Stream({"x": np.array([x], dtype=np.int64)}, controls, arrival)


def run(runner, limit=1000):
    """Iterations until nothing is left: each stream's (ys, totals, error), by stream."""
    seen = {}
    for _ in range(limit):
        for s, outcome, final in runner.run_once():
            ys, totals, error = seen.setdefault(s, ([], [], []))
            if isinstance(outcome, Exception):
                error.append(outcome)
            elif outcome is not None:
                ys.append(int(outcome["y"][0]))
                totals.append(float(outcome["total"][0]))
        if runner.idle:
            return seen
    raise AssertionError("the streams did not end")


def alone(model_path, x, max_tokens):
    runner = counting_runner(model_path)
    s = stream(x, max_tokens)
    runner.submit([s])
    return run(runner)[s]


def test_streams_joining_mid_batch_get_what_each_gets_alone(model_path):
    runner = counting_runner(model_path)
    first = stream(2, max_tokens=10)
    runner.submit([first])
    seen = {}
    for _ in range(3):
        for s, outcome, _ in runner.run_once():
            seen.setdefault(s, ([], [], []))[0].append(int(outcome["y"][0]))
    later = [stream(20, max_tokens=5), stream(14, max_tokens=12)]
    runner.submit(later)
    rest = run(runner)
    assert seen[first][0] + rest[first][0] == list(range(2, 12))
    for s, x, n in zip(later, (20, 14), (5, 12)):
        assert rest[s][0] == list(range(x, x + n))
        assert rest[s][:2] == alone(model_path, x, n)[:2]
    # the cache read back through the blocks: x rows of x, then one row per token since
    assert rest[later[1]][1][:4] == [0.0, 196.0, 196.0 + 15, 196.0 + 15 + 16]


def test_at_most_joins_per_iteration_start_and_max_streams_run(model_path):
    runner = counting_runner(model_path, max_streams=6, joins_per_iteration=4)
    runner.submit([stream(1 + i, max_tokens=3) for i in range(10)])
    live = []
    for _ in range(4):
        runner.run_once()
        live.append(len(runner.engine.live))
    assert live[:2] == [4, 6]          # 4 join, then 2 more (max_streams) while the first step
    assert max(live) <= 6
    assert runner.scheduler.waiting + len(runner.engine.live) <= 10


def test_a_failing_stream_ends_naming_the_step_and_its_neighbours_go_on(model_path):
    runner = counting_runner(model_path)
    unlucky, healthy = stream(11, max_tokens=10), stream(20, max_tokens=10)
    runner.submit([unlucky, healthy])
    seen = run(runner)
    assert seen[unlucky][0] == [11, 12, 13]
    (error,) = seen[unlucky][2]
    assert isinstance(error, ModelError)
    assert "step 'count' failed: RuntimeError: unlucky thirteen" in str(error)
    assert seen[healthy][0] == list(range(20, 30)) and not seen[healthy][2]


def test_bad_input_ends_only_its_own_stream(model_path):
    runner = counting_runner(model_path)
    bad, good = stream(0), stream(5, max_tokens=3)
    runner.submit([bad, good])
    seen = run(runner)
    (error,) = seen[bad][2]
    assert isinstance(error, RequestError) and "x must be at least 1" in str(error)
    assert seen[good][0] == [5, 6, 7]


def test_a_cancelled_stream_gives_its_blocks_back_within_one_iteration(model_path):
    gone = set()
    runner = counting_runner(model_path, is_cancelled=lambda s: s in gone)
    leaving, staying = stream(9, max_tokens=50), stream(3, max_tokens=50)
    runner.submit([leaving, staying])
    for _ in range(3):
        runner.run_once()
    held = runner.engine.cache.taken
    blocks = len(leaving.blocks)
    gone.add(leaving)
    openings, cancelled, running = runner.admit()
    # Its end follows whatever of its outputs still waits to be sent: it is no opening.
    assert openings == [] and [(s, type(o), final) for s, o, final in cancelled] == [(leaving, RequestCancelled, True)]
    assert running == [staying]
    runner.advance(running)
    assert leaving not in runner.engine.live and leaving.blocks == []
    assert runner.engine.cache.taken <= held - blocks + 1  # the staying stream may have taken one more


def test_a_stream_whose_cache_does_not_fit_is_refused_saying_so(model_path):
    runner = counting_runner(model_path, cache_blocks=6)
    huge, small = stream(30), stream(2, max_tokens=3)   # 30 rows: 8 blocks of 4
    runner.submit([huge, small])
    seen = run(runner)
    (error,) = seen[huge][2]
    assert isinstance(error, OutOfMemory)
    assert "the stream's cache does not fit" in str(error) and "cache_blocks=6" in str(error)
    assert seen[small][0] == [2, 3, 4]
    assert runner.engine.cache.taken == 0


def test_a_stream_that_would_fit_alone_is_refused_while_running_streams_hold_the_cache(model_path):
    runner = counting_runner(model_path, cache_blocks=6)
    holder = stream(16, max_tokens=6)   # 16 rows: 4 of the 6 blocks
    runner.submit([holder])
    first = runner.run_once()
    later = stream(12, max_tokens=2)    # 12 rows: 3 blocks, 2 free
    runner.submit([later])
    seen = run(runner)
    (error,) = seen[later][2]
    assert isinstance(error, OutOfMemory)
    assert str(error).startswith("the stream's cache is held by the running streams: cache blocks: 3 needed")
    assert str(error).endswith("it is refused, retry once some end")
    assert [int(o["y"][0]) for _, o, _ in first] + seen[holder][0] == list(range(16, 22))
    later_alone = stream(12, max_tokens=2)
    runner.submit([later_alone])
    assert run(runner)[later_alone][0] == [12, 13]


def test_a_stream_that_outgrows_the_cache_ends_saying_so(model_path):
    runner = counting_runner(model_path, cache_blocks=6)
    growing = stream(20, max_tokens=40)  # 20 rows fill 5 blocks of 4; the 6th holds 4 more
    runner.submit([growing])
    seen = run(runner)
    (error,) = seen[growing][2]
    assert isinstance(error, OutOfMemory)
    assert "the stream cache ran short after 24 tokens" in str(error)
    assert seen[growing][0] == [20, 21, 22, 23, 24] and runner.engine.cache.taken == 0


def test_the_end_token_ends_without_an_output_and_done_with_its_output(model_path):
    runner = counting_runner(model_path)
    ending, done = stream(97, max_tokens=20), stream(46, max_tokens=20)
    runner.submit([ending, done])
    seen = run(runner)
    assert seen[ending][0] == [97, 98, 99]     # 100 is the end token: not sent
    assert seen[done][0] == [46, 47, 48, 49, 50]  # 50 says done: sent, and the last


def test_a_response_not_streamed_is_one_joined_response(model_path):
    runner = counting_runner(model_path)
    whole = stream(3, max_tokens=4, stream=False)
    runner.submit([whole])
    emissions = []
    while not runner.idle:
        emissions += runner.run_once()
    ((s, outcome, final),) = emissions
    assert final and outcome["y"].tolist() == [3, 4, 5, 6]


def test_a_stream_waiting_past_its_timeout_is_refused(model_path):
    clock = [0.0]
    runner = counting_runner(model_path, max_streams=1)
    runner.clock = lambda: clock[0]
    running, waiting = stream(1, max_tokens=30), stream(2, timeout_ms=5.0)
    runner.submit([running, waiting])
    runner.run_once()
    clock[0] = 0.010
    expired = [o for s, o, _ in runner.run_once() if s is waiting]
    assert len(expired) == 1 and isinstance(expired[0], DeadlineExceeded)
    assert "waited 10.0 ms to start, longer than timeout_ms=5" in str(expired[0])


def test_higher_priority_joins_first(model_path):
    runner = counting_runner(model_path, max_streams=1, joins_per_iteration=1)
    low, high = stream(1, max_tokens=1), stream(2, max_tokens=1, priority=3)
    runner.submit([low, high])
    first = runner.run_once()
    assert [s for s, _, _ in first] == [high]


def test_held_state_is_what_the_live_streams_need_and_all_of_it_returns(model_path):
    """Seeded: streams of random lengths join and leave, a quarter cancelled mid-way; at every
    iteration the blocks held are what the live streams' rows need, and at the end none."""
    rng = np.random.default_rng(7)
    gone = set()
    runner = counting_runner(model_path, max_streams=8, cache_blocks=200,
                             is_cancelled=lambda s: s in gone)
    streams = [stream(int(rng.integers(1, 12)), max_tokens=int(rng.integers(1, 30))) for _ in range(400)]
    cancel_at = {s: int(rng.integers(1, 10)) for s in streams if rng.random() < 0.25}
    submitted = 0
    outputs = {s: 0 for s in streams}
    for _ in range(20000):
        if submitted < len(streams) and runner.scheduler.waiting < 4:
            runner.submit(streams[submitted:submitted + 4])
            submitted += 4
        for s, outcome, _ in runner.run_once():
            if isinstance(outcome, dict):
                outputs[s] += 1
                if cancel_at.get(s) == outputs[s]:
                    gone.add(s)
        held = runner.engine.held()
        assert held["held_bytes"] == held["needed_bytes"]
        if submitted >= len(streams) and runner.idle:
            break
    assert runner.idle
    assert runner.engine.cache.taken == 0 and runner.engine.state.taken == 0
    assert runner.figures["cancelled"] > 50
    assert runner.figures["cancelled"] + runner.figures["finished"] + runner.figures["failed"] == len(streams)


def test_a_reading_during_a_step_gets_the_figures_of_the_last_whole_iteration(model_path, monkeypatch):
    """The metrics publisher, on its own thread, reads `runner.held` at any time, a step under
    way included: mid-step, a stream whose last block was full holds its next row's block before
    its row is counted, and a reading of the engine itself shows more held than needed; the
    runner's figures, taken after each whole iteration, never do, and follow the streams."""
    runner = counting_runner(model_path, cache_blocks=64)
    runner.submit([stream(x, max_tokens=30) for x in range(1, 7)])
    readings = []
    step = runner.engine.step_graph.run_batch

    def read_during_the_step(batch):
        readings.append((runner.held, runner.engine.held()))
        return step(batch)

    monkeypatch.setattr(runner.engine.step_graph, "run_batch", read_during_the_step)
    run(runner)
    assert len(readings) > 20
    assert all(published["held_bytes"] == published["needed_bytes"] for published, _ in readings)
    assert any(engine["held_bytes"] > engine["needed_bytes"] for _, engine in readings)
    assert max(published["live"] for published, _ in readings) == 6
    assert len({published["held_bytes"] for published, _ in readings}) > 3  # refreshed as the streams grow
    assert runner.held["live"] == 0 and runner.held["held_bytes"] == 0


def test_the_graphs_count_every_batch_without_growing_when_nobody_reads_their_figures(model_path, monkeypatch):
    from latte.backend.graph import graph as graph_module

    monkeypatch.setattr(graph_module, "UNFOLDED_BATCHES", 8)
    runner = counting_runner(model_path)
    runner.submit([stream(51, max_tokens=40), stream(60, max_tokens=30)])
    seen = run(runner)
    assert [len(ys) for ys, _, _ in seen.values()] == [40, 30]
    step_graph = runner.engine.step_graph
    assert len(step_graph._unfolded) < 8
    assert step_graph.step_figures()["count"]["calls"] == 39  # one batch an iteration after the first


def test_a_joining_streams_first_output_comes_before_the_step_of_those_already_running(model_path):
    runner = counting_runner(model_path)
    old = stream(2, max_tokens=10)
    runner.submit([old])
    runner.run_once()
    new = stream(40, max_tokens=10)
    runner.submit([new])

    openings, cancelled, running = runner.admit()
    assert [(s, int(outcome["y"][0]), final) for s, outcome, final in openings] == [(new, 40, False)]
    assert cancelled == []
    assert running == [old]  # the newcomer's next output is the next iteration's
    stepped = runner.advance(running)
    assert [(s, int(outcome["y"][0])) for s, outcome, _ in stepped] == [(old, 3)]
    assert runner.figures["joined"] == 2 and runner.figures["outputs"] == 3 and runner.iterations == 2


def test_running_streams_are_asked_about_cancellation_a_few_an_iteration_each_once_an_interval(model_path):
    now, asked = [0.0], []

    def is_cancelled(s):
        asked.append((now[0], s))
        return False

    runner = counting_runner(model_path, is_cancelled=is_cancelled, max_streams=16, joins_per_iteration=16,
                             cache_blocks=512)
    runner.clock, runner.cancel_check_s = (lambda: now[0]), 0.05
    together = [stream(51, max_tokens=200) for _ in range(16)]  # all arrive at 0; each ends at 100
    runner.submit(together)
    per_iteration = []
    while runner.engine.live or not per_iteration:
        before = len(asked)
        runner.run_once()
        per_iteration.append(len(asked) - before)
        now[0] += 0.0025
    assert len(per_iteration) >= 50   # 125 ms of iterations
    # Streams that came together are asked over half an interval, not all in one iteration...
    assert max(per_iteration) <= 4 and sum(1 for n in per_iteration if n) >= 8
    # ...and each is asked once an interval: the first after half to one interval, then every interval.
    for s in together:
        times = [t for t, asked_about in asked if asked_about is s]
        assert 0.025 <= times[0] <= 0.0525
        assert len(times) >= 2 and all(0.0475 <= b - a <= 0.0525 for a, b in zip(times, times[1:]))


class EndlessEngine:
    """Streams that start and never end, stepped for free: the runner's own bookkeeping alone."""
    cache = None

    def __init__(self):
        self.live = []

    def start(self, streams):
        self.live.extend(streams)
        return []

    def step(self, streams):
        return []

    def drop(self, stream):
        self.live.remove(stream)

    def held(self):
        return {"live": len(self.live), "held_bytes": 0, "needed_bytes": 0}


def test_streams_asked_together_drift_apart_not_into_one_group_over_many_intervals():
    """Iterations of uneven length (seeded) over 300 intervals: each running stream stays on its
    own schedule, so no iteration asks most of them at once, and each is asked once an interval."""
    from latte.backend.streaming.runner import StreamRunner
    from latte.backend.streaming.scheduler import StreamScheduler

    rng = np.random.default_rng(7)
    now, asked = [0.0], []

    def is_cancelled(s):
        asked.append((len(per_iteration), s))
        return False

    runner = StreamRunner(EndlessEngine(), StreamScheduler(16, 16, 64), cancel_check_s=0.1, clock=lambda: now[0],
                          is_cancelled=is_cancelled)
    together = [stream(1) for _ in range(16)]
    runner.submit(together)
    per_iteration = []
    while now[0] < 30.0:
        before = len(asked)
        runner.run_once()
        per_iteration.append(len(asked) - before)
        now[0] += float(rng.uniform(0.005, 0.015))
    assert max(per_iteration) <= 6
    counts = [sum(1 for _, s in asked if s is mine) for mine in together]
    assert min(counts) >= 295 and max(counts) <= 300


def test_past_the_question_budget_each_stream_is_asked_less_often_and_the_total_stays_within_it():
    """64 streams and at most 100 questions a second: each stream asks every 0.64 s, not every
    0.1 s; 8 streams keep the 0.1 s interval (they ask 80 a second)."""
    from latte.backend.streaming.runner import StreamRunner
    from latte.backend.streaming.scheduler import StreamScheduler

    for count, interval in ((64, 0.64), (8, 0.1)):
        now, asked = [0.0], []

        def is_cancelled(s):
            asked.append((now[0], s))
            return False

        runner = StreamRunner(EndlessEngine(), StreamScheduler(64, 64, 64), cancel_check_s=0.1, cancel_checks_per_s=100,
                              clock=lambda: now[0], is_cancelled=is_cancelled)
        streams = [stream(1) for _ in range(count)]
        runner.submit(streams)
        while now[0] < 20.0:
            runner.run_once()
            now[0] += 0.005
        assert runner.check_interval(len(runner.engine.live)) == pytest.approx(interval)
        for mine in streams:
            times = [t for t, s in asked if s is mine]
            assert all(interval - 0.006 <= b - a <= interval + 0.006 for a, b in zip(times, times[1:]))
        questions_per_s = sum(1 for t, _ in asked if 6.4 <= t < 19.2) / 12.8  # whole intervals of both
        assert questions_per_s <= 100.5
        assert questions_per_s >= 0.95 * min(100.0, count / 0.1)


def test_a_stream_cancelled_past_the_budget_still_leaves_within_its_interval():
    from latte.backend.streaming.runner import StreamRunner
    from latte.backend.streaming.scheduler import StreamScheduler

    now, gone = [0.0], set()
    runner = StreamRunner(EndlessEngine(), StreamScheduler(64, 64, 64), cancel_check_s=0.1, cancel_checks_per_s=100,
                          clock=lambda: now[0], is_cancelled=lambda s: s in gone)
    streams = [stream(1) for _ in range(64)]
    runner.submit(streams)
    left_at = None
    while left_at is None and now[0] < 5.0:
        if now[0] >= 2.0:
            gone.add(streams[10])
        emissions = runner.run_once()
        if any(s is streams[10] for s, _, _ in emissions):
            left_at = now[0]
        now[0] += 0.005
    assert left_at is not None and 2.0 <= left_at <= 2.0 + 0.64 + 0.01
    assert streams[10] not in runner.engine.live and len(runner.engine.live) == 63


def test_a_deep_queue_keeps_its_questions_within_the_budget_and_leaves_the_running_streams_theirs():
    """64 running and 2,000 waiting, at most 100 questions a second: the running streams are
    still asked every 0.64 s (a cancelled one leaves within that), the waiting ones at most 100
    a second, a few each sweep."""
    from latte.backend.streaming.runner import StreamRunner
    from latte.backend.streaming.scheduler import StreamScheduler

    now, asked, gone = [0.0], [], set()

    def is_cancelled(s):
        asked.append((now[0], s))
        return s in gone

    runner = StreamRunner(EndlessEngine(), StreamScheduler(64, 64, 4096), cancel_check_s=0.1, cancel_checks_per_s=100,
                          clock=lambda: now[0], is_cancelled=is_cancelled)
    running, waiting = [stream(1) for _ in range(64)], [stream(1) for _ in range(2000)]
    runner.submit(running)
    runner.run_once()
    runner.submit(waiting)
    left_at = None
    while now[0] < 60.0:
        if now[0] >= 50.0:
            gone.add(running[5])
        emissions = runner.run_once()
        if left_at is None and any(s is running[5] for s, _, _ in emissions):
            left_at = now[0]
        now[0] += 0.005
    times = [t for t, s in asked if s is running[0]]
    assert all(0.634 <= b - a <= 0.646 for a, b in zip(times, times[1:]))
    queued = set(waiting)
    asked_waiting = [t for t, s in asked if 10.0 <= t < 50.0 and s in queued]
    assert 0 < len(asked_waiting) / 40.0 <= 100.5
    # A slice at a time (100 a second, swept every 0.1 s), never the whole queue at once.
    assert max(collections.Counter(asked_waiting).values()) <= 10
    assert left_at is not None and 50.0 <= left_at <= 50.65
    assert len(runner.engine.live) == 64 and runner.scheduler.waiting == 1999  # the first waiting took its place


def test_the_finish_reason_is_the_models_end_or_its_full_context_and_the_end_token_closes(model_path):
    runner = counting_runner(model_path, cache_blocks=128)
    asked = StreamControls(max_tokens=20, additional=("finish_reason", "num_output_tokens"))
    # 97 meets the end token (100); 46 the model's end (50 says done); 251 fills the 256-row context
    ending, done, full = (Stream({"x": np.array([x], dtype=np.int64)}, asked, 0.0) for x in (97, 46, 251))
    runner.submit([ending, done, full])
    said = collections.defaultdict(list)
    while not runner.idle:
        for s, outcome, final in runner.run_once():
            said[s].append(None if outcome is None else (bytes(outcome["finish_reason"][0]), final))
    assert said[ending] == [(b"None", False)] * 3 + [None]
    assert bytes(ending.closing()["finish_reason"][0]) == b"stop"
    assert said[done] == [(b"None", False)] * 4 + [(b"stop", True)]
    assert said[full] == [(b"None", False)] * 5 + [(b"length", True)]


def widen(graph, output):
    """The graph's `output` made a row of two where the streams' state holds one; gives back
    the graph's own run_batch."""
    real = graph.run_batch

    def widened(batch):
        outputs, lengths = real(batch)
        return {**outputs, output: np.concatenate([outputs[output]] * 2, axis=1)}, lengths

    graph.run_batch = widened
    return real


def test_a_start_that_makes_state_of_another_shape_fails_its_streams_and_keeps_nothing(model_path):
    runner = counting_runner(model_path)
    graph = runner.engine.start_graph
    real = widen(graph, "token")
    odd = [stream(2), stream(3)]
    runner.submit(odd)
    seen = run(runner)
    for s in odd:
        (error,) = seen[s][2]
        assert isinstance(error, ModelError)
        assert str(error) == "model 'counting': start.json made 'token' of shape [2] for a stream; its state holds [1]"
    assert runner.engine.state.taken == 0 and runner.engine.cache.taken == 0
    graph.run_batch = real
    later = stream(2, max_tokens=3)
    runner.submit([later])
    assert run(runner)[later][0] == [2, 3, 4]


def test_a_step_that_makes_state_of_another_shape_fails_the_batch_and_keeps_nothing(model_path):
    runner = counting_runner(model_path)
    widen(runner.engine.step_graph, "next_token")
    both = [stream(2), stream(3)]
    runner.submit(both)
    seen = run(runner)
    for s in both:
        ys, _, (error,) = seen[s]
        assert ys == [int(s.inputs["x"][0])]  # its first output, made by start
        assert str(error) == ("model 'counting': step.json made the next 'token' of shape [2, 2] for 2 streams; "
                              "their state holds [2, 1]")
    assert runner.engine.state.taken == 0 and runner.engine.cache.taken == 0


def test_a_prompt_leaves_the_running_streams_the_blocks_their_next_rows_take(model_path):
    runner = counting_runner(model_path, cache_blocks=3)
    running = stream(4, max_tokens=3)  # a prompt of 4 rows fills its one block: its next row takes another
    runner.submit([running])
    seen = {}
    for s, outcome, _ in runner.run_once():
        seen.setdefault(s, []).append(outcome)
    newcomer = stream(8)  # two blocks: all that is free, with none left for the running stream
    runner.submit([newcomer])
    rest = run(runner)
    (error,) = rest[newcomer][2]
    assert isinstance(error, OutOfMemory)
    assert "cache blocks: 2 needed, 2 of 3 free, 1 kept for the running streams' next rows" in str(error)
    assert rest[running][2] == [] and [int(o["y"][0]) for o in seen[running]] + rest[running][0] == [4, 5, 6]
    assert runner.engine.cache.taken == 0


def test_memory_the_start_could_not_get_is_out_of_memory_not_the_models_failure(model_path):
    runner = counting_runner(model_path)

    def exhausted(batch):
        raise MemoryError("the arena has 0 of 4096 bytes free")

    runner.engine.start_graph.run_batch = exhausted
    s = stream(2)
    runner.submit([s])
    (error,) = run(runner)[s][2]
    assert type(error) is OutOfMemory and str(error) == "the arena has 0 of 4096 bytes free"


def test_each_start_and_step_batch_is_recorded_as_a_served_batch_is_and_a_failed_one_as_failed(model_path):
    runner = counting_runner(model_path)
    healthy, unlucky = stream(2, max_tokens=4), stream(12, max_tokens=4)  # the step fails on token 13
    runner.submit([healthy, unlucky])
    seen = run(runner)

    assert seen[healthy][0] == [2, 3, 4, 5]
    (error,) = seen[unlucky][2]
    assert str(error) == "model 'counting': step 'count' failed: RuntimeError: unlucky thirteen"
    assert [(r.rows, r.requests, r.failed) for r in runner.engine.starts.take_records()] == [(2, 2, False)]
    # Both step on; the batch with token 13 fails and each stream runs alone: the healthy one
    # on, the unlucky one failed; then the healthy one alone to its end.
    assert [(r.rows, r.requests, r.failed) for r in runner.engine.steps.take_records()] == [
        (2, 2, False), (2, 2, True), (1, 1, False), (1, 1, True), (1, 1, False)]
