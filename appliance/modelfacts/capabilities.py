"""What a model can be asked for, read from its facts: ``completion``, ``chat``, ``embeddings``.

A generative model completes text. Only one that ships a chat template was
trained to hold a conversation: a model without one is a *base* model (the
default Gemma 3 270M is one), which the appliance still serves on the chat
routes through a fallback template but labels ``base`` everywhere, so people and
clients pick text completion for it. A model with an embedding pooling type is
an embedding model.
"""

from __future__ import annotations

from collections.abc import Mapping

COMPLETION = "completion"
CHAT = "chat"
EMBEDDINGS = "embeddings"
_EMBEDDING_POOLING = frozenset({"mean", "cls", "last", "rank"})


def capabilities(facts: Mapping[str, object]) -> list[str]:
    """The capabilities of a model with these stored facts (``ModelFacts.to_dict()``)."""
    if facts.get("pooling_type") in _EMBEDDING_POOLING:
        return [EMBEDDINGS]
    if facts.get("chat_template"):
        return [COMPLETION, CHAT]
    return [COMPLETION]


def is_base(facts: Mapping[str, object]) -> bool:
    """A generative model without a chat template: it completes text, it was not trained to chat."""
    return capabilities(facts) == [COMPLETION]
