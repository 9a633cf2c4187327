"""A loaded GGUF model: weights, vocabulary, tokenizer and metadata.

Thin, allocation-aware wrappers over libllama's ctypes API. Everything here is
safe to call from any thread (libllama's model and vocab are read-only once
loaded); contexts live in :mod:`.context` and :mod:`.embed`.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass

import llama_cpp.llama_cpp as ll

from .errors import ModelLoadError
from .params import GpuPlacement

_LOG_LEVEL_ERROR = 4  # GGML_LOG_LEVEL_ERROR
_LOG_LEVEL_CONT = 5  # continues the previous message (progress dots)
_last_level = [0]
# llama_token_attr bits of the tokens libllama matches as whole tokens in text
# (llama-vocab.cpp cache_special_tokens): unknown, control, user-defined.
_ATTR_SPECIAL = (1 << 0) | (1 << 3) | (1 << 4)


@ll.llama_log_callback
def _log_errors_only(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    if level != _LOG_LEVEL_CONT:
        _last_level[0] = level
    if _last_level[0] == _LOG_LEVEL_ERROR and text:
        sys.stderr.write(text.decode("utf-8", "replace"))


def quiet_llama_logs() -> None:
    """Route libllama's chatter to /dev/null, keeping errors on stderr."""
    if os.environ.get("APPLIANCE_LLAMA_VERBOSE"):
        return
    ll.llama_log_set(_log_errors_only, ctypes.c_void_p(0))


@dataclass(frozen=True)
class ModelInfo:
    n_vocab: int
    n_embd: int
    n_ctx_train: int
    n_swa: int
    bos: int
    eos: int
    add_bos: bool
    arch: str
    name: str
    chat_template: str | None
    add_eos: bool = False


class LoadedModel:
    """Owns a ``llama_model`` and answers tokenizer questions about it."""

    def __init__(self, path: str, *, n_gpu_layers: int = 0, vocab_only: bool = False, gpu: GpuPlacement | None = None) -> None:
        """Load ``path``; with ``vocab_only`` just the vocabulary and metadata (no weights: for counting tokens).

        ``gpu``: how the offloaded layers spread over the visible GPUs (libllama's defaults when None).
        """
        if not os.path.isfile(path):
            raise ModelLoadError(f"model file not found: {os.path.basename(path)}")
        quiet_llama_logs()
        ll.llama_backend_init()
        params = ll.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        params.vocab_only = vocab_only
        # The split array lives as long as the model: libllama keeps the params it was loaded with.
        self._tensor_split = gpu.apply(params) if gpu is not None else None
        self.ptr = ll.llama_model_load_from_file(path.encode(), params)
        if not self.ptr:
            raise ModelLoadError(f"llama.cpp could not load {os.path.basename(path)} (corrupt or unsupported GGUF)")
        self.vocab = ll.llama_model_get_vocab(self.ptr)
        tmpl = ll.llama_model_chat_template(self.ptr, None)
        self.info = ModelInfo(
            n_vocab=ll.llama_vocab_n_tokens(self.vocab),
            n_embd=ll.llama_model_n_embd(self.ptr),
            n_ctx_train=ll.llama_model_n_ctx_train(self.ptr),
            n_swa=ll.llama_model_n_swa(self.ptr),
            bos=ll.llama_vocab_bos(self.vocab),
            eos=ll.llama_vocab_eos(self.vocab),
            add_bos=bool(ll.llama_vocab_get_add_bos(self.vocab)),
            arch=self.meta("general.architecture") or "",
            name=self.meta("general.name") or "",
            chat_template=tmpl.decode("utf-8", "replace") if tmpl else None,
            add_eos=bool(ll.llama_vocab_get_add_eos(self.vocab)),
        )
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}

    # -- metadata ---------------------------------------------------------
    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1024)
        n = ll.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        if n < 0:
            return None
        return buf.value.decode("utf-8", "replace")

    def token_text(self, token: int) -> str:
        raw = ll.llama_vocab_get_text(self.vocab, token)
        return raw.decode("utf-8", "replace") if raw else ""

    # -- tokenizer --------------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (ll.llama_token * cap)()
        n = ll.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:  # buffer too small: -n is the size needed
            cap = -n
            buf = (ll.llama_token * cap)()
            n = ll.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def is_special(self, token: int) -> bool:
        """True for tokens matched by their text rather than by the tokenizer (``<end_of_turn>``, ``<|im_end|>``)."""
        return bool(ll.llama_vocab_get_attr(self.vocab, token) & _ATTR_SPECIAL)

    def has_special_text(self, text: str) -> bool:
        """True when ``text`` holds the text of a control token (parsing specials would change its ids)."""
        return self.tokenize(text, add_special=False, parse_special=True) != self.tokenize(
            text, add_special=False, parse_special=False
        )

    def tokenize_parts(self, parts: list[tuple[str, bool]], *, add_special: bool = True) -> list[int]:
        """Tokenise ``(text, is_plain)`` parts: special tokens are parsed only in non-plain parts.

        Gives the ids libllama gives for the concatenated text with ``parse_special``,
        except that a plain part never yields a control token: the text is cut at the
        control tokens the non-plain parts hold, and each run of text between them
        (plain and non-plain text merged, so tokens still form across the seams) is
        tokenised without special parsing, as libllama does with each fragment.
        BOS (and EOS, where the vocabulary wants it) is added once.
        """
        frags: list[str | int] = []
        for text, plain in parts:
            if plain or not text:
                frags.append(text)
                continue
            pos = 0
            for t in self.tokenize(text, add_special=False, parse_special=True):
                if not self.is_special(t):
                    continue
                s = self.token_text(t)
                k = text.find(s, pos) if s else -1
                if k < 0:  # e.g. an unknown token the tokenizer produced for raw text
                    continue
                frags.append(text[pos:k])
                frags.append(t)
                pos = k + len(s)
            frags.append(text[pos:])
        out: list[int] = []
        run: list[str] = []
        for f in frags + [-1]:
            if isinstance(f, str):
                run.append(f)
                continue
            text = "".join(run)
            run.clear()
            if text:
                out.extend(self.tokenize(text, add_special=False, parse_special=False))
            if f >= 0:
                out.append(f)
        info = self.info
        if add_special and info.add_bos and info.bos >= 0 and (not out or out[0] != info.bos):
            out.insert(0, info.bos)
        if add_special and info.add_eos and info.eos >= 0:
            out.append(info.eos)
        return out

    def single_token(self, text: str) -> int | None:
        """The id of ``text`` if it is exactly one (special) token, else None."""
        toks = self.tokenize(text, add_special=False, parse_special=True)
        return toks[0] if len(toks) == 1 else None

    def piece(self, token: int) -> bytes:
        """The bytes a token renders to (control tokens render empty). Cached; safe from any thread."""
        p = self._pieces.get(token)
        if p is None:
            buf = ctypes.create_string_buffer(256)  # one per miss: libllama writes it without the GIL
            n = ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
            p = buf.raw[:n]
            self._pieces[token] = p
        return p

    def render_as_text(self, text: str) -> None:
        """Make the control token spelled ``text`` (if the vocabulary has one) render as that text.

        For markers an output parser must see, such as ``[TOOL_CALLS]`` or ``<|python_tag|>``.
        """
        token = self.single_token(text)
        if token is not None and self.is_special(token):
            self._pieces[token] = text.encode()

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        e = self._eog.get(token)
        if e is None:
            e = self._eog[token] = bool(ll.llama_vocab_is_eog(self.vocab, token))
        return e

    def eog_tokens(self) -> list[int]:
        """Every end-of-generation token (scans the vocabulary once)."""
        if not hasattr(self, "_eog_all"):
            self._eog_all = [t for t in range(self.info.n_vocab) if ll.llama_vocab_is_eog(self.vocab, t)]
        return self._eog_all

    def close(self) -> None:
        if self.ptr:
            ll.llama_model_free(self.ptr)
            self.ptr = None
