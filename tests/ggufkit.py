"""Tiny random-weight GGUF models for tests.

``make_tiny_gguf`` writes a llama-architecture model of a few hundred KB with a
real SentencePiece-style ("llama") tokenizer: byte-fallback tokens cover every
UTF-8 string, and a few hundred word pieces make tokenization non-trivial.
llama.cpp loads it and generates (random but deterministic) tokens, which is
all the engine's fast tests need.
"""

from __future__ import annotations

import string
from pathlib import Path

import numpy as np

try:  # gguf is a dependency of the product; keep the import error readable.
    import gguf
except ImportError as exc:  # pragma: no cover
    raise RuntimeError("tests.ggufkit needs the `gguf` package") from exc

SPACE = "\u2581"  # SentencePiece's word-boundary marker

_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "it",
    "you",
    "that",
    "he",
    "was",
    "for",
    "on",
    "are",
    "with",
    "as",
    "his",
    "they",
    "be",
    "at",
    "one",
    "have",
    "this",
    "from",
    "or",
    "had",
    "by",
    "hot",
    "word",
    "but",
    "what",
    "some",
    "we",
    "can",
    "out",
    "other",
    "were",
    "all",
    "there",
    "when",
    "up",
    "use",
    "your",
    "how",
    "said",
    "an",
    "each",
    "she",
    "which",
    "do",
    "their",
    "time",
    "if",
    "will",
    "way",
    "about",
    "many",
    "then",
    "them",
    "write",
    "would",
    "like",
    "so",
    "these",
    "her",
    "long",
    "make",
    "thing",
    "see",
    "him",
    "two",
    "has",
    "look",
    "more",
    "day",
    "could",
    "go",
    "come",
    "did",
    "number",
    "sound",
    "no",
    "most",
    "people",
    "my",
    "over",
    "know",
    "water",
    "than",
    "call",
    "first",
    "who",
    "may",
    "down",
    "side",
    "been",
    "now",
    "find",
    "any",
    "new",
    "work",
    "part",
    "take",
    "get",
    "place",
    "made",
    "live",
    "where",
    "after",
    "back",
    "little",
    "only",
    "round",
    "man",
    "year",
    "came",
    "show",
    "every",
    "good",
    "me",
    "give",
    "our",
    "under",
    "name",
    "very",
    "through",
    "just",
    "form",
    "sentence",
    "great",
    "think",
    "say",
    "help",
    "low",
    "line",
    "hello",
    "world",
    "json",
    "true",
    "false",
    "null",
    "model",
    "token",
    "stream",
    "answer",
    "question",
]


def _vocab(size: int, control: tuple[str, ...] = ()) -> tuple[list[str], list[float], list[int]]:
    """Build an SPM vocabulary: specials (then ``control`` tokens), 256 byte tokens, then word pieces."""
    tokens = ["<unk>", "<s>", "</s>", *control]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.CONTROL] * len(control)
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    pieces: list[str] = [SPACE]
    pieces += list(string.ascii_letters + string.digits + string.punctuation)
    pieces += [SPACE + c for c in string.ascii_letters + string.digits + "{[\"'(-"]
    pieces += [SPACE + w for w in _WORDS] + _WORDS
    # Pairs of letters so the BPE-style merges of the SPM tokenizer have steps.
    for a in "etaoinshrdlu":
        for b in "etaoinshrdlu":
            pieces.append(a + b)
    seen: set[str] = set()
    normal: list[str] = []
    for p in pieces:
        if p not in seen:
            seen.add(p)
            normal.append(p)
    room = size - len(tokens)
    if room < len(string.ascii_letters) + 1:
        raise ValueError(f"vocab={size} is too small; use at least {len(tokens) + 64}")
    normal = normal[:room]
    while len(normal) < room:  # pad with unreachable pieces
        normal.append(f"<unused{len(normal)}>")
    tokens += normal
    types += [gguf.TokenType.NORMAL] * len(normal)
    # Longer pieces score higher so merges prefer them (SPM uses scores as merge priority).
    scores = [0.0] * (3 + len(control) + 256) + [float(len(p)) - i * 1e-4 for i, p in enumerate(normal)]
    return tokens, scores, [int(t) for t in types]


def make_tiny_gguf(
    path: str | Path,
    *,
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_kv_head: int = 2,
    vocab: int = 512,
    ctx: int = 512,
    chat_template: str | None = None,
    seed: int = 0,
    arch: str = "llama",
    control_tokens: tuple[str, ...] = (),
    split_max_tensors: int = 0,
    omit_tensors: tuple[str, ...] = (),
) -> Path:
    """Write a tiny random-weight llama-architecture GGUF to ``path`` and return it.

    Weights are float32 drawn from ``seed``, so two calls with the same arguments
    write byte-identical files. ``chat_template`` (any string, hostile ones
    included) is stored as ``tokenizer.chat_template``. ``control_tokens`` (a chat
    family's turn markers, say) are added as control tokens with ids 3, 4, …
    With ``split_max_tensors``, gguf's writer splits the model into parts of at most
    that many tensors, named ``<stem>-00001-of-0000N.gguf`` beside ``path`` (with
    ``split.count``, ``split.no`` and ``split.tensors.count``); the first part is returned.
    ``omit_tensors`` names tensors left out: a file whose header is sound but which
    llama.cpp refuses to load (a missing tensor).
    """
    if arch != "llama":
        raise ValueError("only arch='llama' is supported")
    if n_embd % n_head or n_head % n_kv_head:
        raise ValueError("n_embd must divide by n_head, and n_head by n_kv_head")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    head_dim = n_embd // n_head
    n_ff = 2 * n_embd

    def w(*shape: int, scale: float = 0.08) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    tokens, scores, types = _vocab(vocab, tuple(control_tokens))
    writer = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)

    def add_tensor(name: str, array: np.ndarray) -> None:
        if name not in omit_tensors:
            writer.add_tensor(name, array)

    writer.add_name("tiny-test-llama")
    writer.add_context_length(ctx)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv_head)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(True)
    if chat_template is not None:
        writer.add_chat_template(chat_template)

    # numpy shapes are (rows, cols) = (out, in); GGUF stores them reversed.
    add_tensor("token_embd.weight", w(len(tokens), n_embd, scale=0.5))
    add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    add_tensor("output.weight", w(len(tokens), n_embd, scale=0.5))
    for i in range(n_layer):
        p = f"blk.{i}."
        add_tensor(p + "attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        add_tensor(p + "attn_q.weight", w(n_embd, n_embd))
        add_tensor(p + "attn_k.weight", w(n_kv_head * head_dim, n_embd))
        add_tensor(p + "attn_v.weight", w(n_kv_head * head_dim, n_embd))
        add_tensor(p + "attn_output.weight", w(n_embd, n_embd))
        add_tensor(p + "ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        add_tensor(p + "ffn_gate.weight", w(n_ff, n_embd))
        add_tensor(p + "ffn_up.weight", w(n_ff, n_embd))
        add_tensor(p + "ffn_down.weight", w(n_embd, n_ff))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if split_max_tensors:
        return sorted(path.parent.glob(f"{path.stem}-00001-of-*.gguf"))[0]
    return path


# -- running the engine worker in tests ------------------------------------------


class WorkerProcess:
    """A real ``appliance.drivers.llamacpp.worker`` subprocess on a Unix socket.

    ``with WorkerProcess(model, tmp_path / "w.sock", parallel=4) as w:`` waits
    until /health is 200 (or raises with the worker's stderr), and stops the
    process on exit. ``w.client()`` is an ``httpx.AsyncClient`` over the socket.
    """

    def __init__(
        self,
        model: str | Path,
        socket_path: str | Path,
        *,
        served_name: str = "test",
        ctx: int = 512,
        parallel: int = 4,
        threads: int = 1,
        extra: tuple[str, ...] = (),
        timeout: float = 60.0,
    ) -> None:
        import sys

        self.socket = str(socket_path)
        self.argv = [
            sys.executable,
            "-m",
            "appliance.drivers.llamacpp.worker",
            "--model",
            str(model),
            "--socket",
            self.socket,
            "--served-name",
            served_name,
            "--ctx",
            str(ctx),
            "--parallel",
            str(parallel),
            "--threads",
            str(threads),
            "--n-gpu-layers",
            "0",
            *extra,
        ]
        self.timeout = timeout
        self.proc = None

    def __enter__(self) -> WorkerProcess:
        import subprocess
        import tempfile
        import time

        import httpx

        self._err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=self._err)
        deadline = time.monotonic() + self.timeout
        with httpx.Client(transport=httpx.HTTPTransport(uds=self.socket), timeout=2) as c:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"worker exited with {self.proc.returncode}: {self.stderr()}")
                try:
                    if c.get("http://worker/health").status_code == 200:
                        return self
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
        self.__exit__(None, None, None)
        raise TimeoutError(f"worker not healthy after {self.timeout}s: {self.stderr()}")

    def stderr(self) -> str:
        self._err.seek(0)
        return self._err.read().decode("utf-8", "replace")

    def client(self, timeout: float = 120.0):
        import httpx

        return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=self.socket), base_url="http://worker", timeout=timeout)

    def sync_client(self, timeout: float = 120.0):
        import httpx

        return httpx.Client(transport=httpx.HTTPTransport(uds=self.socket), base_url="http://worker", timeout=timeout)

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except Exception:
                self.proc.kill()
                self.proc.wait()
