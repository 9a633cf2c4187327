"""Prompt-lookup drafting backs off for a sequence whose drafts keep failing (drivers/llamacpp/speculation.py).

A verified draft is recorded on its sequence's gate; a window of 16 drafted tokens
under 35% accepted pauses drafting for 16 generated tokens, then 32, 64, … up to
256 while windows keep failing; a window that passes brings the pause back to 16.
Drafts shorter than three tokens are never proposed (a loop shorter than the draft is
drafted on around), and a draft is at most seven of the batcher's eight, so the fed
token and its drafts make an even count of rows.
"""

from __future__ import annotations

from appliance.drivers.llamacpp.sequence import Sequence, Slot
from appliance.drivers.llamacpp.slot_results import SlotResults
from appliance.drivers.llamacpp.speculation import SPEC_MAX_SEQS, DraftGate, draft, draft_room, may_draft


def failing_window(gate: DraftGate, generated: int) -> None:
    """Two rejected drafts of eight tokens: one window judged."""
    gate.record(8, 0, generated)
    gate.record(8, 0, generated)


def test_a_window_of_failed_drafts_pauses_drafting_for_sixteen_tokens():
    gate = DraftGate()
    gate.record(8, 0, generated=10)
    assert gate.open(11)  # eight drafted tokens are not a window yet: one unlucky draft
    gate.record(8, 0, generated=11)
    assert not gate.open(11)
    assert not gate.open(26)
    assert gate.open(27)  # 11 + 16
    assert (gate.drafted, gate.accepted) == (16, 0)


def test_the_pause_doubles_while_windows_keep_failing_up_to_256():
    gate = DraftGate()
    pauses = []
    generated = 0
    for _ in range(7):
        failing_window(gate, generated)
        pauses.append(gate.resume_at - generated)
        generated = gate.resume_at
    assert pauses == [16, 32, 64, 128, 256, 256, 256]


def test_a_window_that_pays_keeps_drafting_and_resets_the_pause():
    gate = DraftGate()
    failing_window(gate, 0)
    failing_window(gate, 16)  # the next pause would be 64
    gate.record(8, 6, generated=48)
    gate.record(8, 0, generated=50)  # 6 of 16 accepted (37.5%): pays
    assert gate.open(50)
    failing_window(gate, 60)
    assert gate.resume_at == 60 + 16


def test_acceptance_just_under_a_third_pauses():
    gate = DraftGate()
    gate.record(8, 5, generated=20)
    gate.record(8, 0, generated=21)  # 5 of 16 accepted (31%)
    assert not gate.open(21)
    assert gate.open(37)


def test_prose_that_never_repeats_drafts_twelve_times_in_512_tokens():
    """Every draft rejected: without the gate all 512 steps would draft, with it 12 do."""
    gate = DraftGate()
    drafting_steps = 0
    for generated in range(512):
        if gate.open(generated):
            drafting_steps += 1
            gate.record(8, 0, generated + 1)
    assert drafting_steps == 12
    assert gate.drafted == 96


def slot_with(history: list[int], feed: int, max_new: int = 64) -> Slot:
    seq = Sequence(history, max_new, None, [], spec=True)
    slot = Slot(0)
    slot.seq = seq
    slot.tokens = list(history)
    slot.feed = feed
    return slot


def test_draft_proposes_what_followed_the_last_ngram_in_an_odd_count():
    slot = slot_with([1, 2, 3, 4, 5, 6, 7, 9, 1, 2], feed=3)
    assert draft(slot, 3, 8, 1024) == [4, 5, 6, 7, 9, 1, 2]  # seven: eight rows with the fed token
    assert draft(slot, 3, 4, 1024) == [4, 5, 6]
    assert draft(slot, 3, 5, 1024) == [4, 5, 6, 7, 9]


def test_the_draft_room_is_odd():
    assert [draft_room(n) for n in (3, 4, 7, 8, 9)] == [3, 3, 7, 7, 9]


def test_a_loop_shorter_than_the_draft_is_drafted_on_around():
    # the last 3-gram [8, 7, 8] last occurred two tokens earlier: only [7, 8] follow it, then the loop again
    slot = slot_with([4, 7, 8, 7, 8, 7], feed=8)
    assert draft(slot, 3, 8, 1024) == [7, 8, 7, 8, 7, 8, 7]
    assert draft(slot_with([5, 5, 5], feed=5), 2, 8, 1024) == [5] * 7


def test_draft_proposes_nothing_with_room_for_fewer_than_three_tokens():
    assert draft(slot_with([1, 2, 3, 4, 5, 6, 7, 8, 1, 2], feed=3, max_new=3), 3, 8, 1024) == []  # room for two
    assert draft(slot_with([1, 2, 3, 4, 5, 6, 7, 8, 1, 2], feed=3, max_new=4), 3, 8, 1024) == [4, 5, 6]


def test_draft_proposes_nothing_while_the_gate_is_closed():
    slot = slot_with([1, 2, 3, 4, 5, 6, 7, 9, 1, 2], feed=3)
    failing_window(slot.serving.drafting, 0)
    assert draft(slot, 3, 8, 1024) == []
    slot.serving.n_gen = 16
    assert draft(slot, 3, 8, 1024) == [4, 5, 6, 7, 9, 1, 2]


class _Model:
    def is_eog(self, token: int) -> bool:
        return False

    def piece(self, token: int) -> bytes:
        return b"x"


class _Sampler:
    """Samples ``token`` at every row: drafts of other tokens are rejected at once."""

    def __init__(self, token: int) -> None:
        self.token = token

    def sample(self, slot: Slot, idx: int) -> int:
        return self.token


class _Context:
    def drop(self, sid: int, keep: int) -> None:
        pass


def test_verified_drafts_are_recorded_on_the_sequence_and_close_its_gate():
    stats = {"spec_drafted_total": 0, "spec_accepted_total": 0, "tokens_generated_total": 0}
    results = SlotResults(_Model(), 1024, stats)  # type: ignore[arg-type]
    slot = slot_with([1, 2, 3, 4, 5, 6, 7, 9, 1, 2], feed=3)
    seq = slot.serving
    for _ in range(3):
        slot.drafts = draft(slot, 3, 8, 1024)
        assert len(slot.drafts) == 7
        slot.tokens.append(slot.feed)
        results.verify(slot, _Context(), _Sampler(99), [])  # type: ignore[arg-type]
        slot.tokens[-1:] = []  # the same history again: the lookup finds the same draft
        slot.feed = 3
    assert (seq.drafting.drafted, seq.drafting.accepted) == (21, 0)
    assert stats["spec_drafted_total"] == 21
    assert draft(slot, 3, 8, 1024) == []  # three rejected drafts of seven: drafting pauses


def test_drafts_are_made_only_for_few_streams_and_never_while_an_interactive_prompt_waits():
    assert may_draft(1, prompt_waiting=False)
    assert may_draft(SPEC_MAX_SEQS, prompt_waiting=False)
    assert not may_draft(SPEC_MAX_SEQS + 1, prompt_waiting=False)  # many streams: the step is compute-bound already
    assert not may_draft(1, prompt_waiting=True)  # the drafts' rows would come out of the prompt's reading
    assert not may_draft(0, prompt_waiting=False)
