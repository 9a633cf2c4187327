"""Even output rows: a decode keeping an odd number (3+) of logits rows is padded to even.

The padding logic is checked on plain arrays; what it does to a decode is checked on
a real libllama context (a tiny GGUF): the rows the step asked for are the same with
and without padding, the padding sequence keeps no KV, a padding token that finds no
free KV cell is dropped instead of failing the step, and the calibration leaves the
context as it found it.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import llama_cpp.llama_cpp as ll
import numpy as np
import pytest

from appliance.drivers.llamacpp.context import DecodeContext
from appliance.drivers.llamacpp.model import LoadedModel
from appliance.drivers.llamacpp.output_parity import Calibration, calibrate, even_up
from appliance.drivers.llamacpp.worker import parse_args


def arrays(rows: list[int], n_batch: int = 16) -> SimpleNamespace:
    """A stand-in batch: ``rows`` are the entries' logits flags."""
    n = n_batch
    return SimpleNamespace(
        tok=[7] * n,
        pos=[3] * n,
        lg=rows + [0] * (n - len(rows)),
        sid=[[1] for _ in range(n)],
        n_batch=n_batch,
        pad_token=2,
        pad_sid=9,
    )


@pytest.mark.parametrize("rows", [[1], [1, 1], [1, 1, 1, 1], [0, 0, 1], [1, 0, 1, 0], []])
def test_one_row_and_even_rows_are_left_alone(rows):
    b = arrays(list(rows))
    assert even_up(b, len(rows)) == (len(rows), False)
    assert b.lg[: len(rows)] == rows and b.lg[len(rows)] == 0


def test_an_odd_count_keeps_the_logits_of_a_prompt_token_read_anyway():
    b = arrays([1, 1, 0, 0, 0, 1])
    assert even_up(b, 6) == (6, True)
    assert b.lg[:7] == [1, 1, 0, 0, 1, 1, 0]  # the last entry whose logits were not kept


def test_an_odd_count_of_generating_tokens_gets_a_padding_token():
    b = arrays([1, 1, 1])
    assert even_up(b, 3) == (4, True)
    assert (b.tok[3], b.pos[3], b.lg[3], b.sid[3][0]) == (2, 0, 1, 9)


def test_a_full_batch_is_not_padded():
    b = arrays([1] * 5, n_batch=5)
    assert even_up(b, 5) == (5, False)


def test_calibration_decides_by_a_margin():
    assert Calibration(odd_s=0.055, even_s=0.050).pays
    assert not Calibration(odd_s=0.050, even_s=0.0495).pays  # within the margin: not worth a token
    assert not Calibration(odd_s=0.010, even_s=0.018).pays  # a GPU-like box: even rows cost more


def test_the_worker_flag():
    base = ["--model", "m", "--socket", "s", "--served-name", "n"]
    assert parse_args(base).even_outputs == "auto"
    assert parse_args(base + ["--even-outputs", "off"]).even_outputs == "off"
    with pytest.raises(SystemExit):
        parse_args(base + ["--even-outputs", "sometimes"])


# -- on a real context ------------------------------------------------------------


@pytest.fixture(scope="module")
def model(tiny_gguf):
    m = LoadedModel(str(tiny_gguf))
    yield m
    m.close()


def prefill(c: DecodeContext, sid: int, n: int, first: int = 0) -> None:
    for i in range(n):
        c.tok[i], c.pos[i], c.sid[i][0], c.lg[i] = 5 + (7 * i + sid) % 50, first + i, sid, 0
    c.decode(n)


def rows_of(c: DecodeContext, entries: list[int], n_vocab: int) -> list[np.ndarray]:
    return [np.ctypeslib.as_array(ll.llama_get_logits_ith(c.ctx, i), shape=(n_vocab,)).copy() for i in entries]


def step(c: DecodeContext, entries: list[tuple[int, int, int, int]]) -> None:
    for i, (token, pos, sid, keep) in enumerate(entries):
        c.tok[i], c.pos[i], c.sid[i][0], c.lg[i] = token, pos, sid, keep
    c.decode(len(entries))


def undo(c: DecodeContext, entries: list[tuple[int, int, int, int]]) -> None:
    for sid in {e[2] for e in entries}:
        c.drop(sid, min(e[1] for e in entries if e[2] == sid))


def same_rows(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-3, atol=1e-3 * float(np.abs(x).max()))


def kv_of(c: DecodeContext, sid: int) -> int:
    return ll.llama_memory_seq_pos_max(c.mem, sid)


@pytest.mark.parametrize("with_prompt", [False, True], ids=["generating only", "with a prompt chunk"])
def test_padding_leaves_the_asked_rows_alone_and_no_kv_behind(model, with_prompt):
    c = DecodeContext(model, ctx_per_slot=128, parallel=4, threads=2, n_batch=64)
    try:
        for sid in range(3):
            prefill(c, sid, 6 + sid)  # positions 0 .. 5 + sid
        if with_prompt:  # two generating tokens, and a prompt of 5 read to its end: 3 rows
            entries = [(11, 6, 0, 1), (12, 7, 1, 1)] + [(20 + i, i, 3, int(i == 4)) for i in range(5)]
        else:  # three generating tokens: 3 rows
            entries = [(11, 6, 0, 1), (12, 7, 1, 1), (13, 8, 2, 1)]
        kept = [i for i, e in enumerate(entries) if e[3]]
        assert len(kept) == 3
        step(c, entries)
        plain = rows_of(c, kept, model.info.n_vocab)
        assert c.batch.n_tokens == len(entries)
        undo(c, entries)

        c.even_outputs = True
        step(c, entries)
        padded = rows_of(c, kept, model.info.n_vocab)
        same_rows(plain, padded)
        assert c.padded_steps == 1
        # a prompt token's logits are kept instead of adding a token; else one padding token was decoded
        assert c.batch.n_tokens == len(entries) + (0 if with_prompt else 1)
        assert kv_of(c, c.pad_sid) == -1, "the padding token's KV was kept"
        assert [kv_of(c, sid) for sid in range(4)] == ([6, 7, 7, 4] if with_prompt else [6, 7, 8, -1])
    finally:
        c.close()


def test_a_padding_token_without_a_free_cell_is_dropped(model, monkeypatch):
    # 4 slots of 64: 256 cells. Fill 253 of them, then decode 3 generating tokens: exactly full.
    c = DecodeContext(model, ctx_per_slot=64, parallel=4, threads=2, n_batch=64)
    codes: list[tuple[int, int]] = []
    real = ll.llama_decode

    def recording(ctx, batch):
        rc = real(ctx, batch)
        codes.append((batch.n_tokens, rc))
        return rc

    try:
        assert ll.llama_n_ctx(c.ctx) == 256
        for sid, n in ((0, 63), (1, 63), (2, 63), (3, 64)):
            prefill(c, sid, n)
        c.even_outputs = True
        monkeypatch.setattr(ll, "llama_decode", recording)
        step(c, [(11, 63, 0, 1), (12, 63, 1, 1), (13, 63, 2, 1)])  # no cell for a fourth token
        assert codes == [(4, 1), (3, 0)]  # padded: no KV slot; then decoded without the padding token
        assert c.padded_steps == 0  # the step ran unpadded
        assert [kv_of(c, sid) for sid in range(4)] == [63, 63, 63, 63]
        assert kv_of(c, c.pad_sid) == -1
    finally:
        c.close()


def test_the_calibration_is_not_swayed_by_decodes_another_process_slowed(monkeypatch):
    """Even rows are 8x faster here, but two of the five even-row decodes are held up 300 ms (a neighbour starting)."""
    c = SimpleNamespace(**vars(arrays([], n_batch=16)), ctx=object(), mem=object(), batch=SimpleNamespace(n_tokens=0))
    held = iter([True, True])  # the first two even-row decodes

    def decode(ctx, batch):
        slow = batch.n_tokens == 8 and next(held, False)
        time.sleep(0.3 if slow else 0.005 if batch.n_tokens == 8 else 0.04)
        return 0

    monkeypatch.setattr(ll, "llama_decode", decode)
    monkeypatch.setattr(ll, "llama_memory_seq_rm", lambda *a: True)
    result = calibrate(c)
    assert result is not None and result.pays  # a median of three rounds would have said 0.3 s against 0.04 s
    assert result.even_s < 0.3


def test_the_calibration_times_both_counts_and_leaves_the_context_empty(model):
    c = DecodeContext(model, ctx_per_slot=128, parallel=2, threads=2, n_batch=64)
    try:
        result = calibrate(c)
        assert result is not None and result.odd_s > 0 and result.even_s > 0
        assert [kv_of(c, sid) for sid in range(3)] == [-1, -1, -1]
        assert not c.even_outputs  # calibrating decides nothing by itself
    finally:
        c.close()
    small = DecodeContext(model, ctx_per_slot=128, parallel=2, threads=2, n_batch=4)
    try:
        assert calibrate(small) is None  # a batch smaller than the even count: nothing to compare
    finally:
        small.close()
