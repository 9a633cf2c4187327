"""A tiny random-weight Llama in Hugging Face format, for the vLLM tests.

The folder holds what an imported HF model holds: ``config.json``,
``model.safetensors``, ``generation_config.json`` and a fast tokenizer with a
chat template. The weights are random (seeded), so the text is gibberish, but
vLLM loads, schedules and streams it like any Llama.

Shape: hidden 128, 2 heads of head_dim 64 (vLLM's CPU attention kernel rejects
head_dim 16), 2 layers, a byte-level vocabulary of 256 bytes + 4 specials.

transformers and torch live in the vLLM environment, not the appliance's, so
:func:`make_tiny_hf_llama` runs this file as a script with that environment's
interpreter.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SPECIALS = ["<s>", "</s>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'user' %}<|user|>{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}<|assistant|>{{ m['content'] }}{{ eos_token }}"
    "{% else %}{{ m['content'] }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def make_tiny_hf_llama(dest: Path, python: str | Path, seed: int = 0, timeout: float = 180.0) -> Path:
    """Write the model into ``dest`` (created) using ``python`` (one with transformers + torch)."""
    dest = Path(dest)
    if all((dest / f).exists() for f in FILES):
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    result = subprocess.run([str(python), __file__, str(dest), str(seed)], capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"building the tiny HF model with {python} failed:\n{result.stderr[-3000:]}")
    return dest


def _build(dest: Path, seed: int) -> None:  # runs inside the vLLM environment
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    byte_chars = sorted(ByteLevel.alphabet())  # the 256 printable stand-ins for bytes
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    vocab.update({ch: len(SPECIALS) + i for i, ch in enumerate(byte_chars)})
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="</s>",
        additional_special_tokens=["<|user|>", "<|assistant|>"],
        model_max_length=2048,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(dest)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        bos_token_id=vocab["<s>"],
        eos_token_id=vocab["</s>"],
        pad_token_id=vocab["</s>"],
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(dest, safe_serialization=True)
    # Leftover pickles would be refused by the store: keep the folder safetensors-only.
    for leftover in dest.glob("*.bin"):
        leftover.unlink()


if __name__ == "__main__":
    _build(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 0)
