"""How much work one decode step carries: the learned step cost, the planner's time budget, and the rate pacer.

The cost model and the planner are pure arithmetic over step shapes and times, fed
here as numbers; ``test_step_planning_engine.py`` drives the real batcher.
"""

from __future__ import annotations

import argparse
import random

import pytest

from appliance.drivers.llamacpp.batch_yield import BATCH_DUE_SAFETY, BATCH_INTERFERENCE
from appliance.drivers.llamacpp.latency import LatencyTargets, parse_targets, priority_of
from appliance.drivers.llamacpp.scheduling import MIN_RATE_SAMPLE, StepPacer
from appliance.drivers.llamacpp.sequence import Sequence, Slot
from appliance.drivers.llamacpp.step_cost import MIN_PROMPT_SAMPLES, StepCostModel
from appliance.drivers.llamacpp.step_planner import (
    CATCH_UP_TOKENS,
    FULL_BATCH_GAIN,
    FULL_BATCH_REACH,
    LONE_FRACTION,
    MIN_PREFILL_TOKENS,
    OVERDUE_TARGETS,
    QUEUE_FACTOR,
    SLACK_CAP,
    SMALL_JOB_S,
    TPOT_SAFETY,
    TTFT_SAFETY,
    StepPlanner,
)

# -- the rate pacer (embedding groups, and the planner before its cost model is ready) ----------


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


# -- the step cost model ---------------------------------------------------------------------


def feed(model: StepCostModel, a: float, b: float, c: float, steps: int, seed: int = 1, noise: float = 0.0) -> None:
    rng = random.Random(seed)
    for _ in range(steps):
        rows, prompt = rng.randint(0, 8), rng.choice([0, 0, 16, 40, 100, 256])
        t = a + b * rows + c * prompt
        model.observe(rows, prompt, t * (1 + rng.uniform(-noise, noise)))


def test_cost_model_recovers_a_boxs_coefficients():
    model = StepCostModel()
    feed(model, 0.004, 0.005, 0.0025, 80)
    a, b, c = model.coef
    assert (a, b, c) == pytest.approx((0.004, 0.005, 0.0025), rel=1e-3)
    assert model.ready
    assert model.prompt_rate == pytest.approx(400.0, rel=1e-3)
    # a 150 ms step beside 8 generating rows: (0.15 - 0.004 - 0.04) / 0.0025 = 42.4 prompt tokens
    assert model.prompt_tokens_within(0.15, 8) == 42
    assert model.prompt_tokens_within(0.01, 8) == 0  # the rows alone take longer


def test_cost_model_keeps_coefficients_non_negative_under_noise():
    model = StepCostModel()
    feed(model, 0.0, 0.0002, 0.00005, 200, seed=7, noise=0.5)  # a GPU-like box: tiny costs, noisy timings
    assert all(x >= 0.0 for x in model.coef)
    assert model.coef[2] > 0.0


def test_cost_model_follows_the_box_when_it_slows_down():
    model = StepCostModel()
    feed(model, 0.004, 0.005, 0.0025, 60)
    feed(model, 0.008, 0.010, 0.005, 300, seed=2)  # another process took half the cores
    assert model.coef == pytest.approx((0.008, 0.010, 0.005), rel=0.02)


def test_cost_model_is_not_ready_before_it_saw_prompts_read():
    model = StepCostModel()
    for _ in range(50):
        model.observe(4, 0, 0.03)  # decode-only steps say nothing of a prompt token's cost
    assert not model.ready and model.prompt_rate is None
    for _ in range(MIN_PROMPT_SAMPLES):
        model.observe(1, 64, 0.2)
    assert model.ready


def test_cost_model_ignores_empty_and_stalled_steps():
    model = StepCostModel()
    model.observe(0, 0, 0.1)
    model.observe(3, 10, 0.0)
    model.observe(3, 10, 3600.0)
    assert model.coef == (0.0, 0.0, 0.0) and model.prompt_samples == 0


# -- the planner --------------------------------------------------------------------------------


def seq(
    prompt_len: int,
    *,
    priority: str = "interactive",
    n_gen: int = 0,
    t_first: float = 0.0,
    t_submit: float = 0.0,
    max_new: int = 16,
):
    s = Sequence(list(range(1, prompt_len + 1)), max_new, None, [])
    s.priority, s.n_gen, s.t_first, s.t_submit = priority, n_gen, t_first, t_submit
    return s


def slot(i: int, sequence: Sequence, read: int = 0) -> Slot:
    sl = Slot(i)
    sl.seq = sequence
    sl.tokens = sequence.prompt[:read]
    return sl


def ready_planner(a=0.004, b=0.005, c=0.0025, n_batch=256, targets=None) -> StepPlanner:
    planner = StepPlanner(targets or LatencyTargets(), n_batch)
    rng = random.Random(3)
    for _ in range(60):
        rows, prompt = rng.randint(0, 8), rng.choice([0, 16, 64, 160])  # no whole batch read alone
        planner.observe(rows, prompt, a + b * rows + c * prompt)
    assert planner.cost.ready
    return planner


def test_a_step_nobody_generates_beside_lasts_a_share_of_the_ttft_target():
    planner = ready_planner()
    reading = [slot(0, seq(500))]
    assert planner.step_seconds(reading, now=10.0) == pytest.approx(LONE_FRACTION * 2.0)
    batch_only = [slot(0, seq(500, priority="batch"))]
    assert planner.step_seconds(batch_only, now=10.0) == pytest.approx(LONE_FRACTION * 30.0)
    # a chat read beside the document: steps no longer than a TPOT target, so its first token comes soon
    beside = [slot(0, seq(500)), slot(1, seq(12))]
    assert planner.step_seconds(beside, now=10.0) == pytest.approx(min(LONE_FRACTION * 2.0, 0.15))


def test_lone_steps_run_long_while_prompts_queue_or_where_that_makes_the_ttft_target():
    planner = ready_planner()  # 46 prompt tokens in a 0.125 s step (368 tokens/s); a 2 s target, 1.7 s for short steps
    short = LONE_FRACTION * 2.0
    full = planner.cost.predict(1, 256)  # a whole batch
    assert pytest.approx(1.7) == TTFT_SAFETY * 2.0
    assert planner.full_batch_rate(short) == pytest.approx(FULL_BATCH_GAIN * 46 / short)  # none timed yet: 552/s

    def step(active: list[Slot], now: float = 10.0) -> float:
        return planner.step_seconds(active, now)

    # met in short steps (9 of them, 1.125 s): short steps, an arrival waits little
    assert step([slot(0, seq(400, t_submit=10.0))]) == pytest.approx(short)
    # 600 tokens: 14 short steps (1.75 s) miss it; whole batches (1.09 s) make it
    assert step([slot(0, seq(600, t_submit=10.0))]) == pytest.approx(full)
    # ... and keep doing so once ahead: judged on the whole prompt too, it does not finish at the last moment
    assert step([slot(0, seq(600, t_submit=10.0), read=400)], now=10.5) == pytest.approx(full)
    # a prompt short steps would read in time, but which waited for a slot: the time left counts
    assert step([slot(0, seq(400, t_submit=9.0))]) == pytest.approx(full)
    # 1,200 tokens: 2.17 s at whole batches' rate, within FULL_BATCH_REACH of the target (the rate is an estimate)
    assert step([slot(0, seq(1200, t_submit=10.0))]) == pytest.approx(full)
    # too long to make it even so (1,400 tokens: 2.54 s), or already past it: short steps
    assert 1400 / planner.full_batch_rate(short) > FULL_BATCH_REACH * 2.0
    assert step([slot(0, seq(1400, t_submit=10.0))]) == pytest.approx(short)
    assert step([slot(0, seq(600, t_submit=10.0))], now=12.1) == pytest.approx(short)
    # a chat one short step reads, beside the document: it gets its first token first
    beside = [slot(0, seq(600, t_submit=10.0)), slot(1, seq(12, t_submit=10.0))]
    assert step(beside) == pytest.approx(min(short, 0.15))
    # a queue: two prompts that a short step does not read whole
    queue = [slot(0, seq(200, t_submit=9.0)), slot(1, seq(60, t_submit=10.0))]
    assert step(queue) == pytest.approx(QUEUE_FACTOR * short)
    # a chat that one short step reads, beside a prompt short steps serve: short
    assert step([slot(0, seq(200)), slot(1, seq(40))]) == pytest.approx(short)
    # batch prompts make no queue of interactive work, and before the cost is known steps stay short
    batch = [slot(0, seq(200, priority="batch")), slot(1, seq(200, priority="batch")), slot(2, seq(200))]
    assert step(batch) == pytest.approx(short)
    fresh = StepPlanner(LatencyTargets(), 256)
    assert fresh.step_seconds([slot(0, seq(200)), slot(1, seq(200))], now=10.0) == pytest.approx(short)


def test_whole_batches_read_alone_teach_the_rate_that_decides_long_steps():
    planner = ready_planner()
    short = LONE_FRACTION * 2.0
    document = [slot(0, seq(1400, t_submit=10.0))]
    assert planner.step_seconds(document, now=10.0) == pytest.approx(short)  # 2.54 s at the assumed 552/s
    for _ in range(10):  # whole batches read alone at 700 tokens/s (a step beside streams, or a short one, does not count)
        planner.observe(0, 256, 256 / 700)
        planner.observe(6, 256, 1.0)
        planner.observe(0, 40, 1.0)
    assert planner.full_batch_rate(short) == pytest.approx(700, rel=0.01)
    assert planner.step_seconds(document, now=10.0) > short  # 2.0 s: whole batches make it now
    assert planner.step_seconds([slot(0, seq(1800, t_submit=10.0))], now=10.0) == pytest.approx(short)  # 2.6 s: no


def test_a_stream_ahead_of_its_target_lends_its_slack_to_prompt_reading():
    planner = ready_planner()
    # 10 tokens since t_first=0 at now=0.3 s: due at 0.9*0.15*10 = 1.35 s, capped at SLACK_CAP targets
    ahead = slot(0, seq(10, n_gen=10, t_first=0.0, max_new=10))
    assert SLACK_CAP * 0.15 < 1.35 - 0.3
    assert planner.step_seconds([ahead], now=0.3) == pytest.approx(SLACK_CAP * 0.15)
    # just on time, with no tokens left to make up a delay: the next token is due in 0.05 s
    on_time = slot(1, seq(10, n_gen=10, t_first=0.0, max_new=10))
    assert planner.step_seconds([on_time], now=TPOT_SAFETY * 0.15 * 10 - 0.05) == pytest.approx(0.05)
    # the most hurried stream decides
    assert planner.step_seconds([ahead, on_time], now=TPOT_SAFETY * 0.15 * 10 - 0.05) == pytest.approx(0.05)


def test_a_young_stream_lends_what_its_next_tokens_can_make_up():
    planner = ready_planner()  # a step of one stream's decode alone: 4 + 5 = 9 ms
    young = streaming(0, priority="interactive", n_gen=1, t_first=0.0)
    young.seq.max_new = 200
    credit = CATCH_UP_TOKENS * (TPOT_SAFETY * 0.15 - 0.009)
    now = TPOT_SAFETY * 0.15 + credit - 0.2  # 0.2 s before its deadline plus what it can make up
    assert planner.step_seconds([young], now=now) == pytest.approx(0.2, abs=1e-3)
    # near its end a stream has fewer tokens to make a delay up with: it lends less
    ending = streaming(1, priority="interactive", n_gen=1, t_first=0.0)
    ending.seq.max_new = 3  # two tokens left
    assert planner.step_seconds([ending], now=now) < 0
    # where decoding alone takes the whole target, nothing can be made up: no credit
    slow = ready_planner(a=0.2)
    assert slow.step_seconds([young], now=TPOT_SAFETY * 0.15 - 0.05) == pytest.approx(0.05, abs=1e-3)


def test_a_late_stream_that_can_catch_up_takes_the_step_alone():
    planner = ready_planner()
    late = streaming(0, priority="interactive", n_gen=10, t_first=0.0)
    seconds = planner.step_seconds([late], now=5.0)
    assert seconds < 0
    assert planner.prompt_budget(seconds, rows=2, room=250) == 0
    # a box too slow to keep the target even decoding alone still reads prompts: the floor
    slow = ready_planner(a=0.2)
    assert slow.prompt_budget(slow.step_seconds([late], now=5.0), rows=2, room=250) >= MIN_PREFILL_TOKENS


def test_the_budget_is_what_the_learned_cost_fits_in_the_time():
    planner = ready_planner()
    # (0.3 - 0.004 - 9 * 0.005) / 0.0025 = 100.4
    assert planner.prompt_budget(0.3, rows=9, room=250) == 100
    assert planner.prompt_budget(10.0, rows=9, room=247) == 247  # never past the batch


def test_before_the_cost_is_known_the_rate_pacer_sizes_steps():
    planner = StepPlanner(LatencyTargets(), 256)
    assert planner.prompt_budget(0.25, rows=1, room=255) == MIN_PREFILL_TOKENS
    planner.observe(1, 99, 0.25)  # 400 tokens per second
    assert planner.prompt_budget(0.25, rows=1, room=255) == 99


def test_prompts_that_can_still_meet_their_ttft_target_are_read_first_soonest_due_first():
    planner = ready_planner()  # 400 prompt tokens per second
    long_doc = slot(0, seq(1500, t_submit=0.0))  # 3.75 s of reading: it cannot meet a 2 s target
    chat = slot(1, seq(12, t_submit=0.5))
    shares = planner.shares([long_doc, chat], 64, now=0.6)
    assert [(s.id, n) for s, n in shares] == [(1, 12), (0, 52)]
    # a note that can still make it and is due sooner goes before a later chat (earliest deadline first)
    note = slot(2, seq(300, t_submit=0.0))  # 0.75 s of reading, due at 2.0 s
    fresh_chat = slot(3, seq(12, t_submit=1.0))  # due at 3.0 s
    order = planner.order([fresh_chat, long_doc, note], now=1.0)
    assert [s.id for s in order] == [2, 3, 0]
    # the document has waited OVERDUE_TARGETS targets: it goes first
    later = OVERDUE_TARGETS * 2.0
    assert [s.id for s in planner.order([slot(4, seq(12, t_submit=later)), long_doc], now=later)] == [0, 4]


def test_small_requests_run_without_other_prompts_read_beside_them():
    planner = ready_planner()  # a=4 ms, b=5 ms a row, c=2.5 ms a prompt token
    assert planner.is_small(prompt_tokens=20, max_new=4)
    assert not planner.is_small(prompt_tokens=20, max_new=256)  # 256 decodes outlast SMALL_JOB_S
    assert not planner.is_small(prompt_tokens=int(SMALL_JOB_S / 0.0025), max_new=1)
    assert not StepPlanner(LatencyTargets(), 256).is_small(20, 4)  # nothing measured yet: nothing is small
    doc = slot(0, seq(1500, t_submit=0.0))
    quick = slot(1, seq(20, t_submit=1.0))
    quick.serving.small = True
    assert planner.small_first([doc, quick], [doc, quick], now=1.0) == [quick]
    # while the small request decodes, no prompt is read
    quick.tokens, quick.feed = quick.serving.prompt[:], 3
    assert planner.small_first([doc, quick], [doc], now=1.1) == []
    assert planner.small_first([doc], [doc], now=1.1) is None  # no small request runs
    # a prompt that has waited OVERDUE_TARGETS targets is read beside small requests again
    assert planner.small_first([doc, quick], [doc], now=OVERDUE_TARGETS * 2.0) is None


def test_interactive_prompts_are_read_before_batch_ones():
    planner = ready_planner()
    batch = slot(0, seq(8, priority="batch", t_submit=0.0))
    interactive = slot(1, seq(200, t_submit=9.0))
    shares = planner.shares([batch, interactive], 100, now=10.0)
    assert [(s.id, n) for s, n in shares] == [(1, 100)]


# -- batch work beside interactive work ----------------------------------------------------------


def streaming(i: int, *, priority: str, n_gen: int, t_first: float) -> Slot:
    """A slot whose sequence generates (its next token is fed this step)."""
    sl = slot(i, seq(10, priority=priority, n_gen=n_gen, t_first=t_first), read=10)
    sl.feed = 7
    return sl


def test_with_no_interactive_work_batch_uses_the_whole_box():
    planner = ready_planner()
    batch = [streaming(i, priority="batch", n_gen=50, t_first=0.0) for i in range(6)]
    assert planner.batch_room(batch, now=1.0) is None


def test_beside_interactive_streams_batch_rows_fit_in_the_interference_share():
    planner = ready_planner()  # a=4 ms, b=5 ms a row, c=2.5 ms a prompt token
    interactive = [streaming(i, priority="interactive", n_gen=10, t_first=0.0) for i in range(4)]
    # batch streams well ahead of their 0.5 s target: none is due
    batch = [streaming(4 + i, priority="batch", n_gen=10 + i, t_first=0.0) for i in range(4)]
    room = planner.batch_room(interactive + batch, now=1.0)
    assert room is not None
    # the interactive step costs 4 + 4 * 5 = 24 ms; its interference share is below one 5 ms row
    assert BATCH_INTERFERENCE * 0.024 < 0.005
    assert room.decoding == frozenset()
    assert room.prompt_tokens == int(BATCH_INTERFERENCE * 0.024 / 0.0025)
    # a box where rows are cheap beside a large fixed cost lets batch rows in, the furthest behind first
    cheap = ready_planner(a=0.1, b=0.001, c=0.0005)
    room = cheap.batch_room(interactive + batch, now=1.0)
    assert room is not None
    expected = min(4, int(BATCH_INTERFERENCE * (0.1 + 4 * 0.001) / 0.001))
    assert len(room.decoding) == expected
    assert room.decoding == frozenset(s.id for s in batch[:expected])


def test_a_batch_stream_due_on_its_own_target_decodes_whatever_it_costs():
    planner = ready_planner()
    interactive = [streaming(i, priority="interactive", n_gen=10, t_first=0.0) for i in range(4)]
    # 10 tokens since t_first=0: due at 0.9 * 0.5 * 10 = 4.5 s
    late = streaming(4, priority="batch", n_gen=10, t_first=0.0)
    ahead = streaming(5, priority="batch", n_gen=40, t_first=0.0)
    room = planner.batch_room([*interactive, late, ahead], now=BATCH_DUE_SAFETY * 0.5 * 10 + 0.01)
    assert room is not None
    assert room.decoding == frozenset({late.id})
    # even while the interactive streams are behind their own target
    behind = [streaming(i, priority="interactive", n_gen=10, t_first=0.0) for i in range(4)]
    room = planner.batch_room([*behind, late, ahead], now=10.0)
    assert room is not None and room.decoding == frozenset({late.id})


def test_a_late_interactive_stream_leaves_batch_no_optional_work():
    planner = ready_planner(a=0.1, b=0.001, c=0.0005)
    late = streaming(0, priority="interactive", n_gen=10, t_first=0.0)  # due at 1.5 s
    batch = streaming(1, priority="batch", n_gen=10, t_first=1.0)
    room = planner.batch_room([late, batch], now=2.0)
    assert room is not None
    assert room.decoding == frozenset() and room.prompt_tokens == 0


def test_batch_prompts_are_read_only_in_what_interactive_work_leaves():
    planner = ready_planner()
    chat = slot(0, seq(20, t_submit=9.0))
    line = slot(1, seq(30, priority="batch", t_submit=9.5))
    shares = planner.shares([line, chat], 64, now=10.0, batch_cap=5)
    assert [(s.id, n) for s, n in shares] == [(0, 20), (1, 5)]
    # a batch prompt that waited half its TTFT target is read beside interactive work at the floor
    stream = streaming(2, priority="interactive", n_gen=10, t_first=9.0)
    patient = slot(3, seq(30, priority="batch", t_submit=0.0))
    room = planner.batch_room([stream, patient], now=16.0)
    assert room is not None and room.prompt_tokens >= MIN_PREFILL_TOKENS


def test_interactive_deadlines_alone_set_the_step_beside_late_batch_streams():
    planner = ready_planner()
    interactive = streaming(0, priority="interactive", n_gen=10, t_first=0.0)
    interactive.serving.max_new = 11  # one token left: almost nothing to make a delay up with
    late_batch = streaming(1, priority="batch", n_gen=2, t_first=0.0)
    late_batch.serving.max_new = 3
    # the interactive stream is due at 1.35 s (plus its last token's catch-up); the batch stream was due long ago
    catch_up = TPOT_SAFETY * 0.15 - planner.cost.predict(2, 0)
    expected = TPOT_SAFETY * 0.15 * 10 - 1.3 + catch_up
    assert planner.step_seconds([interactive, late_batch], now=1.3) == pytest.approx(expected)
    assert planner.step_seconds([late_batch], now=1.5) < 0


# -- targets and classes ------------------------------------------------------------------------


def test_latency_targets_parse_and_default():
    targets = parse_targets("batch:60:1.5")
    assert (targets.of("batch").ttft_s, targets.of("batch").tpot_s) == (60.0, 1.5)
    assert (targets.of("interactive").ttft_s, targets.of("interactive").tpot_s) == (2.0, 0.15)
    assert targets.of("no-such-class") == targets.of("interactive")
    assert parse_targets(targets.as_arg()).as_arg() == targets.as_arg()


@pytest.mark.parametrize(
    "text", ["urgent:1:0.1", "interactive:2", "interactive:two:0.1", "interactive:0:0.1", "batch:nan:1", "batch:1:inf"]
)
def test_latency_targets_refuse_nonsense(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_targets(text)


def test_priority_header_names_the_class():
    assert priority_of({"headers": [(b"x-appliance-priority", b" Batch ")]}) == "batch"
    assert priority_of({"headers": [(b"x-appliance-priority", b"realtime")]}) == "interactive"
    assert priority_of({"headers": []}) == "interactive"


def test_expected_seconds_come_from_the_named_regimes_model_once_it_is_ready():
    regime = [2]
    planner = StepPlanner(LatencyTargets(), 256, regime=lambda: regime[0])
    assert planner.expected_seconds(2, 4, 0) is None  # nothing learned
    for rows, tokens in ((4, 0), (4, 32), (8, 0), (2, 64), (6, 16), (1, 128)):
        planner.observe(rows, tokens, 0.01 + 0.005 * rows + 0.002 * tokens)
    assert planner.expected_seconds(2, 4, 10) == pytest.approx(0.01 + 0.02 + 0.02, rel=0.05)
    assert planner.expected_seconds(1, 4, 10) is None  # another thread count: its own model, not learned yet
