"""The outboxes between the iteration loop and the sender threads: a stream's first output
goes ahead of the running streams' backlog, everything else leaves in order, and a full
outbox holds the loop back."""

import threading
import time

import numpy as np
import pytest

from counting_stream import counting_runner, write_counting_stream
from latte.backend.options import RequestOptions
from latte.backend.streaming.controls import StreamControls
from latte.backend.streaming.outbox import Outbox
from latte.backend.streaming.runner import Ready
from latte.backend.streaming.streams import Stream


def test_openings_leave_first_and_the_rest_in_the_order_posted():
    outbox = Outbox(8)
    outbox.put(["step 1"])
    outbox.put(["step 2"])
    outbox.put(["first of a", "first of b"], opening=True)
    outbox.put(None)
    outbox.put(["first of c"], opening=True)
    assert outbox.waiting() == (2, 3)
    assert [outbox.get() for _ in range(5)] == [["first of a", "first of b"], ["first of c"], ["step 1"], ["step 2"],
                                                None]


def test_a_full_outbox_holds_the_poster_until_a_sender_takes_a_list():
    outbox = Outbox(2)
    outbox.put(["a"])
    outbox.put(["b"])
    outbox.put(["first"], opening=True)   # openings count apart: the backlog does not hold them
    posted = threading.Event()
    poster = threading.Thread(target=lambda: (outbox.put(["c"]), posted.set()), daemon=True)
    poster.start()
    assert not posted.wait(0.2)
    assert outbox.get() == ["first"]
    assert not posted.wait(0.2)           # taking an opening makes no room for the rest
    assert outbox.get() == ["a"]
    assert posted.wait(10)
    assert [outbox.get(), outbox.get()] == [["b"], ["c"]]


def test_a_sender_takes_the_openings_posted_while_it_sends_a_list():
    outbox = Outbox(2)
    assert outbox.openings() == []
    outbox.put(["first of a"], opening=True)
    outbox.put(["first of b", "first of c"], opening=True)
    outbox.put(["step 1"])
    assert outbox.openings() == ["first of a", "first of b", "first of c"]
    assert outbox.waiting() == (0, 1) and outbox.get() == ["step 1"]


def test_a_newcomers_first_output_goes_before_the_rest_of_the_list_being_sent():
    from latte.backend.streaming.model import StreamingModel

    outbox, sent = Outbox(2), []

    class Sender:
        _send_all, _send_guarded = StreamingModel._send_all, StreamingModel._send_guarded

        def _send_one(self, stream, outcome, final):
            sent.append(stream)
            if stream == "old 1":   # a newcomer starts while this send is under way
                outbox.put([("new", "its first", False)], opening=True)

    Sender()._send_all([("old 1", "y", False), ("old 2", "y", False), ("old 3", "y", True)], outbox)
    assert sent == ["old 1", "new", "old 2", "old 3"]
    assert outbox.waiting() == (0, 0)


def test_bad_outboxes_are_refused():
    with pytest.raises(ValueError, match="at least one list"):
        Outbox(0)
    with pytest.raises(ValueError, match="follows everything"):
        Outbox(1).put(None, opening=True)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return write_counting_stream(tmp_path_factory.mktemp("counting"), max_tokens=256)


def stream(x, max_tokens):
    controls = StreamControls(stream=True, max_tokens=max_tokens, options=RequestOptions())
    return Stream({"x": np.array([x], dtype=np.int64)}, controls, 0.0)


def _until(condition, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def test_a_newcomers_first_output_is_sent_before_the_backlog_of_running_streams(model_path):
    runner = counting_runner(model_path)
    (outbox,) = runner.outboxes
    old = stream(14, max_tokens=200)   # done at 50 (counting_stream.py)
    runner.submit([old])
    runner.start("outbox-test")
    try:
        # The loop ran ahead and waits for the sender: iteration 1 started the stream (its
        # first output, an opening), each later one posted a step, the last of which waits.
        assert _until(lambda: outbox.waiting()[1] == outbox.bound and runner.iterations == outbox.bound + 2)
        outputs = outbox.get()   # the old stream's first output, an opening itself
        newcomer = stream(51, max_tokens=5)
        runner.submit([newcomer])
        outputs += outbox.get()  # room for one more list: the loop goes on and admits the newcomer
        assert [s for s, _, _ in outputs] == [old, old]
        assert _until(lambda: outbox.waiting()[0] == 1)
        (first,) = outbox.get()
        assert first[0] is newcomer and int(first[1]["y"][0]) == 51 and first[2] is False
        # The rest of the old stream's outputs follow in order, none lost or repeated.
        ys = [int(outcome["y"][0]) for s, outcome, _ in outputs]
        while ys[-1] < 50:
            ys += [int(o["y"][0]) for s, o, _ in outbox.get() if s is old]
        assert ys == list(range(14, 51))
    finally:
        runner.close()
        while len(outbox):
            outbox.get()


def test_a_stream_that_arrives_during_a_step_starts_before_the_steps_outputs_are_posted(model_path):
    runner = counting_runner(model_path)
    (outbox,) = runner.outboxes
    posted, newcomer = [], stream(51, max_tokens=3)
    put = outbox.put

    def recording_put(emissions, opening=False):
        if emissions is not None:
            posted.append(("opening" if opening else "step", [s for s, _, _ in emissions]))
        put(emissions, opening)

    step = runner.engine.step

    def step_while_one_arrives(streams):
        if runner.iterations == 1:   # the old stream's first step
            runner.submit([newcomer])
        return step(streams)

    outbox.put, runner.engine.step = recording_put, step_while_one_arrives
    old = stream(14, max_tokens=4)
    runner.submit([old])
    runner.start("arrival-test")
    try:
        assert _until(lambda: sum(1 for _, streams in posted if old in streams) == 4)
    finally:
        runner.close()
        while len(outbox):
            outbox.get()
    # The old stream's first output, its step that the newcomer arrived during, held back until
    # the newcomer's first output was posted.
    assert posted[:3] == [("opening", [old]), ("opening", [newcomer]), ("step", [old])]


def test_with_nothing_to_step_the_loop_sends_a_newcomers_first_output_itself(model_path):
    runner = counting_runner(model_path)
    (outbox,) = runner.outboxes
    sent_by_loop = []
    runner.send = lambda *emission: sent_by_loop.append((threading.current_thread().name, emission))
    alone = stream(14, max_tokens=10)
    runner.submit([alone])
    runner.start("lone-test")
    try:
        posted = outbox.get()   # its second output; the loop runs at most two lists ahead
        beside = stream(30, max_tokens=3)   # arrives while `alone` runs: a step comes first
        runner.submit([beside])
        while sum(1 for e in posted if e[2]) < 2:
            posted += outbox.get()
        assert _until(lambda: runner.idle)
        pair = [stream(40, max_tokens=2), stream(42, max_tokens=2)]   # a burst: the senders send it
        runner.submit(pair)
        while sum(1 for e in posted if e[2]) < 4:
            posted += outbox.get()
    finally:
        runner.close()
    assert [(name, e[0], int(e[1]["y"][0])) for name, e in sent_by_loop] == [("latte-streams-lone-test", alone, 14)]
    assert [int(o["y"][0]) for s, o, _ in posted if s is alone] == list(range(15, 24))
    assert [int(o["y"][0]) for s, o, _ in posted if s is beside] == [30, 31, 32]
    assert [[int(o["y"][0]) for s, o, _ in posted if s is mine] for mine in pair] == [[40, 41], [42, 43]]


def test_the_loop_makes_the_responses_and_ends_a_stream_whose_output_it_cannot_make(model_path):
    def prepare(outcome):
        if isinstance(outcome, dict) and int(outcome["y"][0]) == 16:
            raise RuntimeError("an output the response cannot carry")
        return ("response", outcome)

    runner = counting_runner(model_path)
    runner.prepare = prepare
    (outbox,) = runner.outboxes
    runner.submit([stream(14, max_tokens=4)])
    runner.start("prepare-test")
    try:
        sent = []
        while not sent or not sent[-1][2]:
            sent += outbox.get()
    finally:
        runner.close()
    assert [int(outcome.response[1]["y"][0]) for _, outcome, _ in sent[:2]] == [14, 15]
    _, error, final = sent[2]
    assert len(sent) == 3 and final
    assert str(error) == ("model 'counting': could not make a response of its output: RuntimeError: an output "
                          "the response cannot carry")
    assert runner.engine.state.taken == 0 and runner.engine.cache.taken == 0


def test_a_send_that_fails_ends_that_stream_alone_with_a_final_error():
    # The senders and the loop (a lone newcomer's first output) send through this one guard.
    from types import SimpleNamespace

    from latte.backend.errors import ModelError
    from latte.backend.streaming.model import StreamingModel

    logged, sent = [], []

    class Model:
        _send_guarded = StreamingModel._send_guarded
        name = "textgen"
        pb = SimpleNamespace(Logger=SimpleNamespace(log_error=logged.append))
        responses = SimpleNamespace(error=lambda exc: ("error", str(exc)))

        def _send_one(self, stream, outcome, final):
            raise RuntimeError("the response could not be made")

        def _send(self, sender, response, final, stream=None):
            sent.append((sender, response, final))

    failing = SimpleNamespace(sender="its sender", cancelled=False)
    Model()._send_guarded(failing, "its output", True)
    message = "model 'textgen' could not send its response; the server log says why"
    assert sent == [("its sender", ("error", message), True)]
    # Not final: the loop ends the stream at its next iteration with this error (INTERNAL), not as
    # cancelled by its client; no other stream is touched.
    midway = SimpleNamespace(sender="another sender", cancelled=False)
    Model()._send_guarded(midway, "its output", False)
    assert type(midway.cancelled) is ModelError and str(midway.cancelled) == message
    assert len(sent) == 1
    assert logged[0].startswith("latte: textgen: could not send a response: RuntimeError: the response could not")


def test_a_stream_whose_response_could_not_be_sent_ends_with_that_error_not_as_cancelled(model_path):
    from latte.backend.errors import ModelError

    runner = counting_runner(model_path)
    broken, beside = stream(14, max_tokens=6), stream(30, max_tokens=3)
    runner.submit([broken, beside])
    runner.run_once()  # both start
    broken.cancelled = ModelError("model 'counting' could not send its response; the server log says why")
    emissions = runner.run_once()
    ended = [(outcome, final) for s, outcome, final in emissions if s is broken]
    assert len(ended) == 1 and ended[0][1] and ended[0][0] is broken.cancelled
    assert [int(o["y"][0]) for s, o, _ in emissions if s is beside] == [31]
    assert runner.figures["failed"] == 1 and runner.figures["cancelled"] == 0
