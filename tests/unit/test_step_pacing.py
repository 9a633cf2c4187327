"""How much work one decode step carries: the fair split of prompt tokens and the time-based pacer."""

from __future__ import annotations

import pytest

from appliance.drivers.llamacpp.scheduling import MIN_RATE_SAMPLE, StepPacer, fair_shares


def test_fair_shares_serves_small_wants_whole_and_splits_the_rest():
    assert fair_shares([5, 1000, 1000], 45) == [5, 20, 20]
    assert fair_shares([3, 4], 100) == [3, 4]
    assert sum(fair_shares([7, 9, 11], 10)) == 10
    assert fair_shares([], 10) == []


def test_pacer_starts_at_its_floor_until_a_step_was_seen():
    pacer = StepPacer(16)
    assert pacer.tokens(0.25, 256) == 16
    assert pacer.tokens(0.25, 8) == 8  # never past the ceiling


def test_pacer_turns_a_learned_rate_into_tokens_for_a_target_time():
    pacer = StepPacer(16)
    pacer.observe(200, 1.0)  # 200 tokens per second
    assert pacer.rate == pytest.approx(200.0)
    assert pacer.tokens(0.25, 256) == 50
    assert pacer.tokens(0.01, 256) == 16  # not below the floor
    assert pacer.tokens(10.0, 256) == 256  # not above the batch


def test_pacer_follows_the_box_as_it_slows_down():
    pacer = StepPacer(16)
    pacer.observe(200, 1.0)
    for _ in range(20):
        pacer.observe(50, 1.0)
    assert pacer.rate == pytest.approx(50.0, rel=0.01)
    assert pacer.tokens(0.5, 256) == 25


def test_pacer_ignores_steps_too_small_or_too_short_to_measure():
    pacer = StepPacer(16)
    pacer.observe(MIN_RATE_SAMPLE - 1, 0.001)
    pacer.observe(100, 0.0)
    assert pacer.rate is None
    pacer.observe(MIN_RATE_SAMPLE, 0.1)
    assert pacer.rate == pytest.approx(MIN_RATE_SAMPLE / 0.1)
