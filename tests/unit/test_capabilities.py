"""What a model can be asked for, from its stored facts: base models complete text, chat models also chat."""

from appliance.modelfacts.capabilities import capabilities, is_base


def test_a_model_without_a_chat_template_is_a_base_model():
    assert capabilities({"architecture": "gemma3", "chat_template": None}) == ["completion"]
    assert is_base({"architecture": "gemma3"})


def test_a_model_with_a_chat_template_chats():
    assert capabilities({"architecture": "llama", "chat_template": "{{ messages }}"}) == ["completion", "chat"]
    assert not is_base({"chat_template": "{{ messages }}"})


def test_an_embedding_model_embeds_only():
    assert capabilities({"architecture": "bert", "pooling_type": "mean"}) == ["embeddings"]
    assert capabilities({"architecture": "llama", "pooling_type": "none", "chat_template": "x"}) == ["completion", "chat"]
