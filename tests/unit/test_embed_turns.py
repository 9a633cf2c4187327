"""The embedding queue's share of the decode thread: one group at a time, decoding first when it begins.

The queue's decisions only (its groups are replaced by a recorder); the real embedding context is
exercised by the worker's integration tests.
"""

from __future__ import annotations

from appliance.drivers.llamacpp.embed import FIRST_DECODE_S, SMALL_HOLD_S, EmbedQueue


def queue_with_a_job() -> tuple[EmbedQueue, list[int]]:
    q = EmbedQueue(model=None, ctx=512, n_seq=4, threads=2)  # type: ignore[arg-type]  # the model is never reached
    groups: list[int] = []

    def step(max_tokens: int) -> int:
        groups.append(max_tokens)
        return 10

    q._step = step  # type: ignore[method-assign]  # records the groups instead of embedding them
    q.add([[1, 2, 3]] * 100, lambda result: None)
    q.take()
    return q, groups


def test_alone_the_queue_embeds_a_group_every_turn():
    q, groups = queue_with_a_job()
    for _ in range(3):
        assert q.turn(decoding=False, generating=False) is not None
    assert len(groups) == 3 and q.debt == 0.0


def test_a_chat_that_starts_decodes_first_then_shares_the_thread():
    q, groups = queue_with_a_job()
    q.turn(decoding=False, generating=False)  # embedding alone
    assert q.turn(decoding=True, generating=True) is None  # the chat arrived: its steps go first
    assert len(groups) == 1 and q.debt == FIRST_DECODE_S
    q.decoded(FIRST_DECODE_S / 2)
    assert q.turn(decoding=True, generating=True) is None
    q.decoded(FIRST_DECODE_S / 2)
    assert q.turn(decoding=True, generating=True) is not None  # paid back: the next group runs
    assert len(groups) == 2
    assert q.turn(decoding=True, generating=True) is None  # and owes its own time again
    assert q.debt > 0.0


def test_no_job_no_debt():
    q = EmbedQueue(model=None, ctx=512, n_seq=4, threads=2)  # type: ignore[arg-type]
    assert q.turn(decoding=True, generating=True) is None and q.debt == 0.0


def test_a_small_request_holds_the_next_group_until_it_is_done():
    q, groups = queue_with_a_job()
    q.turn(decoding=False, generating=False)
    assert q.turn(decoding=True, generating=True, small=True) is None
    q.decoded(FIRST_DECODE_S)  # its first steps repaid what a plain chat would be owed
    assert q.turn(decoding=True, generating=True, small=True) is None  # still no group beside the short answer
    q.decoded(0.05)
    assert len(groups) == 1
    assert q.turn(decoding=False, generating=False) is not None  # done: the corpus goes on
    assert len(groups) == 2


def test_small_requests_hold_embedding_back_only_so_long_in_a_row():
    q, groups = queue_with_a_job()
    q.turn(decoding=False, generating=False)
    held = 0.0
    while q.turn(decoding=True, generating=True, small=True) is None:
        q.decoded(0.05)
        held += 0.05
        assert held <= SMALL_HOLD_S + 0.05, "a trickle of short answers must not stop the corpus"
    assert held >= SMALL_HOLD_S - 1e-9
    assert len(groups) == 2
