"""A sender's outbox: a stream's first output goes ahead of the outputs the sender still holds for
the streams already running, which leave in the order they were made; closing comes last."""

import threading

from latte.backend.streaming.outbox import Outbox


def test_first_outputs_go_ahead_of_the_iterations_still_held():
    outbox = Outbox(iterations=4)
    outbox.put(["a1", "b1"])
    outbox.put(["a2", "b2"])
    outbox.put(["c0"], first=True)
    outbox.put(["a3", "b3", "c1"])
    outbox.close()
    taken = []
    while (emissions := outbox.get()) is not None:
        taken.append(emissions)
    assert taken == [["c0"], ["a1", "b1"], ["a2", "b2"], ["a3", "b3", "c1"]]


def test_a_full_outbox_holds_the_loop_until_the_sender_takes_one():
    outbox = Outbox(iterations=1)
    outbox.put(["first"], first=True)
    outbox.put(["following"])
    third = threading.Thread(target=outbox.put, args=(["next"],))
    third.start()
    third.join(0.2)
    assert third.is_alive()                       # two parts of one iteration: the outbox is full
    assert outbox.get() == ["first"]
    third.join(5)
    assert not third.is_alive()
    assert [outbox.get(), outbox.get()] == [["following"], ["next"]]
