"""/v1/models says what each model can be asked for: a GGUF without a chat template is a base model.

A real daemon imports two tiny real GGUFs, one with a chat template and one
without; the listing (through the real OpenAI client too) labels them, an
alias carries its target's capabilities, and the default model (Gemma 3 270M,
a base model) says ``["completion"]``.
"""

from __future__ import annotations

import openai
import pytest

from tests.daemon import start_daemon
from tests.ggufkit import make_tiny_gguf
from tests.reliability.kit import import_model

pytestmark = pytest.mark.slow

CHAT_TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}<|assistant|>"


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    models = tmp_path_factory.mktemp("caps-models")
    daemon = start_daemon(tmp_path_factory.mktemp("caps"))
    try:
        import_model(daemon, make_tiny_gguf(models / "tiny-chat.gguf", chat_template=CHAT_TEMPLATE), "tinychat:f32", timeout=60)
        import_model(daemon, make_tiny_gguf(models / "tiny-base.gguf", seed=1), "tinybase:f32", timeout=60)
        with daemon.admin() as admin:
            assert admin.put("/admin/aliases/writer", json={"target": "tinybase:f32"}).status_code == 200
        yield daemon
    finally:
        daemon.stop()


def test_models_list_their_capabilities(box):
    key = box.create_key("caps")
    with box.client(key) as client:
        listing = client.get("/v1/models").json()["data"]
    caps = {m["id"]: m["capabilities"] for m in listing}
    assert caps["tinychat:f32"] == ["completion", "chat"]
    assert caps["tinybase:f32"] == ["completion"]
    assert caps["writer"] == ["completion"]  # an alias: its target's
    assert caps["gemma-3-270m:q4_k_m"] == caps["default"] == ["completion"]  # the default model is a base model


def test_the_openai_client_reads_the_field(box):
    client = openai.OpenAI(base_url=box.url + "/v1", api_key=box.create_key("caps-sdk"))
    models = {m.id: m for m in client.models.list()}
    assert models["tinybase:f32"].model_extra["capabilities"] == ["completion"]
    assert models["tinychat:f32"].model_extra["capabilities"] == ["completion", "chat"]
