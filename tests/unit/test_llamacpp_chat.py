"""Chat templates run sandboxed; hostile ones are refused with a clear 400."""

from __future__ import annotations

import pytest

from appliance.drivers.llamacpp.chat import (
    CHATML_TEMPLATE,
    GEMMA_TEMPLATE,
    PLAIN_TEMPLATE,
    ChatRenderer,
    normalize_messages,
    pick_fallback,
)
from appliance.drivers.llamacpp.errors import ChatTemplateError
from appliance.errors import BadRequest

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def test_ssti_through_lipsum_globals_does_not_run(tmp_path):
    marker = tmp_path / "pwned"
    evil = "{{ lipsum.__globals__['os'].popen('touch " + str(marker) + "').read() }}"
    r = ChatRenderer(evil)
    with pytest.raises(ChatTemplateError) as e:
        r.render(MSGS)
    assert e.value.status == 400
    assert not marker.exists()


def test_ssti_through_class_walk_is_refused(tmp_path):
    evil = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(ChatTemplateError):
        ChatRenderer(evil).render(MSGS)


def test_template_cannot_mutate_messages():
    with pytest.raises(ChatTemplateError):
        ChatRenderer("{% set _ = messages.append({'role':'x'}) %}").render(MSGS)


def test_broken_template_is_a_400_on_use():
    r = ChatRenderer("{% for %}")
    with pytest.raises(ChatTemplateError):
        r.render(MSGS)


def test_raise_exception_helper():
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        ChatRenderer("{{ raise_exception('roles must alternate') }}").render(MSGS)


def test_tools_reach_the_template():
    r = ChatRenderer("{% for t in tools %}{{ t.function.name }}{% endfor %}|{{ messages[-1].content }}")
    out = r.render(MSGS, tools=[{"type": "function", "function": {"name": "get_weather"}}])
    assert out == "get_weather|Hi"


def test_fallback_choice():
    assert pick_fallback(lambda t: t in {"<start_of_turn>", "<end_of_turn>"}) is PLAIN_TEMPLATE
    assert pick_fallback(lambda t: t in {"<|im_start|>", "<|im_end|>"}) is CHATML_TEMPLATE
    assert pick_fallback(lambda t: False) is PLAIN_TEMPLATE


def test_gemma_fallback_renders_turns():
    out = ChatRenderer(GEMMA_TEMPLATE, bos_token="<bos>").render(MSGS)
    assert out.startswith("<bos><start_of_turn>user\nBe brief.<end_of_turn>\n")
    assert out.endswith("<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n")


def test_content_parts_are_joined():
    msgs = normalize_messages([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    assert msgs[0]["content"] == "ab"


@pytest.mark.parametrize("bad", [None, [], [{"content": "x"}], [{"role": "user", "content": 3}]])
def test_bad_messages(bad):
    with pytest.raises(BadRequest):
        normalize_messages(bad)
