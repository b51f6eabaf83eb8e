"""The files a supervised model's process shares with `latte serve`: its flight file, its
poison list and its sessions' checkpoint, each read back as the other side reads it."""

import json
import time

import numpy as np
import pytest

from latte.supervision.checkpoint import SessionCheckpoint
from latte.supervision.flight import SLOTS, FlightRecorder, longest_running_s, read_flights
from latte.supervision.poison import REFUSE_AFTER, PoisonList, input_digest
from latte.supervision.state import flight_path, poison_path, sessions_dir, state_dir


def digest(value):
    return input_digest([("x", np.array([value], np.float32))])


def test_the_state_folder_is_the_environments_and_none_without_it(tmp_path):
    assert state_dir({}) is None
    assert state_dir({"LATTE_STATE_DIR": "  "}) is None
    assert state_dir({"LATTE_STATE_DIR": str(tmp_path)}) == tmp_path
    assert flight_path(tmp_path, "m", "m_0", 42) == tmp_path / "m" / "flight" / "m_0.42"
    assert poison_path(tmp_path, "m") == tmp_path / "m" / "poison.json"
    assert sessions_dir(tmp_path, "m") == tmp_path / "m" / "sessions"


def test_a_batch_marked_is_read_back_with_its_digests_until_it_ends(tmp_path):
    path = tmp_path / "flight" / "m_0.1"
    recorder = FlightRecorder(path, pid=1)
    try:
        assert read_flights(path) == []
        before = time.monotonic()
        first = recorder.begin([digest(1), digest(2)])
        second = recorder.begin([digest(3)])
        flights = sorted(read_flights(path), key=lambda f: len(f.digests))
        assert [f.digests for f in flights] == [[digest(3)], [digest(1), digest(2)]]
        assert all(before <= f.started_s <= time.monotonic() for f in flights)
        assert longest_running_s(flights, now_s=flights[0].started_s + 5) >= 5
        recorder.end(first)
        assert [f.digests for f in read_flights(path)] == [[digest(3)]]
        recorder.end(second)
        assert read_flights(path) == [] and longest_running_s([]) == 0.0
    finally:
        recorder.close()
    assert not path.exists()


def test_a_batch_past_the_slots_goes_unmarked_and_an_ended_one_frees_its_slot(tmp_path):
    path = tmp_path / "m_0.1"
    recorder = FlightRecorder(path)
    try:
        slots = [recorder.begin([digest(i)]) for i in range(SLOTS)]
        assert sorted(slots) == list(range(SLOTS))
        assert recorder.begin([digest(99)]) is None
        recorder.end(None)  # an unmarked batch's end clears nothing
        assert len(read_flights(path)) == SLOTS
        recorder.end(slots[3])
        assert recorder.begin([digest(100)]) == slots[3]
        assert digest(100) in [d for f in read_flights(path) for d in f.digests]
    finally:
        recorder.close()


def test_a_file_that_is_not_a_flight_file_reads_as_nothing_in_flight(tmp_path):
    (tmp_path / "other").write_bytes(b"x" * 100_000)
    assert read_flights(tmp_path / "other") == []
    assert read_flights(tmp_path / "missing") == []


def test_an_input_counts_once_per_crash_and_is_refused_after_two_once_alone(tmp_path):
    path = tmp_path / "m" / "poison.json"
    poisons = PoisonList(path)
    # One crash: a batch of 1 and 2 (1 in it twice), and 3 alone in a batch of its own.
    assert poisons.record_crash([[digest(1), digest(1), digest(2)], [digest(3)]]) == set()
    assert poisons.crashes == {digest(1).hex(): 1, digest(2).hex(): 1, digest(3).hex(): 1}
    assert PoisonList(path).refused() == set()
    assert PoisonList(path).suspects() == {digest(1), digest(2), digest(3)}  # each runs alone from now on
    # In flight with another at a second crash: twice, but never alone, so maybe innocent.
    assert poisons.record_crash([[digest(1), digest(2)]]) == set()
    # Alone at the third: refused.
    assert poisons.record_crash([[digest(1)]]) == {digest(1).hex()}
    assert REFUSE_AFTER == 2
    assert PoisonList(path).refused() == {digest(1)}  # as the model reads it at its next load
    assert PoisonList(path).suspects() == {digest(2), digest(3)}
    assert poisons.record_crash([[digest(1)]]) == set()  # refused already: not newly
    # Alone at its first crash, then in a batch at its second: refused too.
    assert poisons.record_crash([[digest(3), digest(4)]]) == {digest(3).hex()}


@pytest.mark.parametrize("text", ["not json", '{"crashes": {"ab": null}}', '["a list"]'])
def test_a_poison_file_that_cannot_be_read_refuses_nothing(tmp_path, text):
    path = tmp_path / "poison.json"
    path.write_text(text)
    assert PoisonList(path).refused() == set()


def test_an_input_digest_tells_names_dtypes_shapes_and_values_apart():
    base = input_digest([("x", np.array([[1, 2]], np.int64))])
    assert len(base) == 16 and base == input_digest([("x", np.array([[1, 2]], np.int64))])
    assert base != input_digest([("y", np.array([[1, 2]], np.int64))])
    assert base != input_digest([("x", np.array([[1, 2]], np.int32))])
    assert base != input_digest([("x", np.array([1, 2], np.int64))])
    assert base != input_digest([("x", np.array([[1, 3]], np.int64))])
    text = input_digest([("t", np.array([b"a", b"b"], dtype=object))])
    assert text != input_digest([("t", np.array([b"ab", b""], dtype=object))])


def test_sessions_are_kept_loaded_and_dropped(tmp_path):
    kept = SessionCheckpoint(tmp_path / "sessions")
    kept.save("chat-1", np.array([1, 2, 3], np.int64))
    kept.save("chat-2", np.array([7], np.int64))
    kept.save("chat-1", np.array([1, 2, 3, 4], np.int64))  # the next turn replaces the last
    loaded = SessionCheckpoint(tmp_path / "sessions").load()
    assert sorted(loaded) == ["chat-1", "chat-2"]
    np.testing.assert_array_equal(loaded["chat-1"], [1, 2, 3, 4])
    assert loaded["chat-1"].dtype == np.int64
    kept.drop("chat-2")
    kept.drop("never-kept")
    assert sorted(kept.load()) == ["chat-1"]
    assert not list((tmp_path / "sessions").glob("*.tmp"))


def test_a_torn_session_file_is_skipped_and_removed(tmp_path):
    kept = SessionCheckpoint(tmp_path)
    kept.save("whole", np.array([1, 2], np.int64))
    kept.save("torn", np.array([1, 2, 3], np.int64))
    torn = kept._file("torn")
    torn.write_bytes(torn.read_bytes()[:-3])  # cut inside its last token
    (tmp_path / "garbled").write_bytes(b"\xff\xfe no header")
    (tmp_path / "short").write_bytes(json.dumps({"id": "s", "dtype": "int64", "length": 4}).encode() + b"\n"
                                     + np.arange(2, dtype=np.int64).tobytes())
    loaded = kept.load()
    assert list(loaded) == ["whole"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [kept._file("whole").name]
