"""When a finished batch's requests are answered through their senders rather than with
execute's return value."""

import pytest

from latte.backend.responses import EarlyAnswers


def never_lower():
    return 0


def test_auto_sends_early_only_when_a_request_takes_longer_than_a_send():
    small = EarlyAnswers("auto", send_s=300e-6)
    for _ in range(50):
        small.batch_done(requests=4, seconds=200e-6)  # 50 us of model time per request
    # However many wait: every send would delay all of them by more than it saves.
    assert not small.now(finished_priority=0, pending=40, pending_priority=never_lower)
    heavy = EarlyAnswers("auto", send_s=300e-6)
    for _ in range(50):
        heavy.batch_done(requests=8, seconds=8e-3)  # 1 ms per request
    assert heavy.now(finished_priority=0, pending=1, pending_priority=never_lower)


def test_auto_answers_a_higher_priority_at_once_whatever_the_cost():
    early = EarlyAnswers("auto")
    assert early.now(finished_priority=9, pending=1, pending_priority=lambda: 0)
    assert not early.now(finished_priority=9, pending=1, pending_priority=lambda: 9)


def test_sends_that_turn_out_slow_make_auto_hold_more():
    early = EarlyAnswers("auto", send_s=100e-6)
    for _ in range(50):
        early.batch_done(requests=1, seconds=200e-6)
    assert early.now(finished_priority=0, pending=3, pending_priority=never_lower)
    for _ in range(50):
        early.sent(sends=2, seconds=2e-3)  # 1 ms a send
    assert not early.now(finished_priority=0, pending=3, pending_priority=never_lower)


def test_fixed_modes_and_the_last_batch():
    assert EarlyAnswers("per_batch").now(0, 1, never_lower)
    assert not EarlyAnswers("per_call").now(9, 5, lambda: 0)
    assert not EarlyAnswers("per_batch").now(0, 0, never_lower)  # nothing left: the return value carries it
    with pytest.raises(ValueError, match="auto, per_batch, per_call"):
        EarlyAnswers("sometimes")
