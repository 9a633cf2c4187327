"""The Ollama API's error shape (one handler, keyed on the path family) and its model views."""

from types import SimpleNamespace

from litestar.testing import TestClient

from appliance.api.errors import EXCEPTION_HANDLERS
from appliance.api.ollama import OllamaController
from appliance.api.openai import OpenAIController
from appliance.planner.types import DeviceMemory
from appliance.serving.ollama import views
from appliance.store.variants import VariantInfo
from tests.appkit import local_admin_app


def _client() -> TestClient:
    # every request here is refused while its body is read, before a collaborator is used
    services = SimpleNamespace(gateway=None, names=None, settings=None, store=None, router=None)
    app = local_admin_app([OllamaController, OpenAIController], services, exception_handlers=EXCEPTION_HANDLERS)
    return TestClient(app)


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_api_errors_are_ollama_shaped_and_v1_errors_stay_openai_shaped():
    with _client() as client:
        unknown = client.post("/api/chat", json={**CHAT, "bogus": 1})
        assert unknown.status_code == 400 and list(unknown.json()) == ["error"] and "bogus" in unknown.json()["error"]
        invalid = client.post("/api/generate", json={"model": "m", "stream": "yes"})
        assert invalid.status_code == 400 and list(invalid.json()) == ["error"] and "stream" in invalid.json()["error"]
        missing = client.get("/api/no-such-route")
        assert missing.status_code == 404 and isinstance(missing.json()["error"], str)
        openai = client.post("/v1/chat/completions", json={**CHAT, "bogus": 1})
        assert openai.status_code == 400 and openai.json()["error"]["param"] == "bogus"


def _info(**facts) -> VariantInfo:
    return VariantInfo(
        id=1,
        name="gemma-3-270m:q4_k_m",
        family="gemma-3-270m",
        variant="q4_k_m",
        format="gguf",
        quantization="q4_k_m",
        path="x",
        size_bytes=253_000_000,
        sha256="ab" * 32,
        status="ready",
        source=None,
        parent=None,
        facts={"architecture": "gemma3", "parameter_count": 268_098_176, "context_length": 32768, "n_layer": 18, **facts},
        is_default=True,
        pinned=False,
        created_at=1_767_225_600.0,
    )


def test_parameter_sizes_read_like_ollama():
    assert [views.parameter_size(n) for n in (268_098_176, 7_615_616_512, 999, None)] == ["268.1M", "7.6B", "999", ""]


def test_tag_entry_and_show():
    entry = views.tag_entry("default", _info())
    assert entry["name"] == "default" and entry["modified_at"] == "2026-01-01T00:00:00Z" and entry["digest"] == "ab" * 32
    assert entry["details"] == {
        "parent_model": "",
        "format": "gguf",
        "family": "gemma3",
        "families": ["gemma3"],
        "parameter_size": "268.1M",
        "quantization_level": "Q4_K_M",
    }
    shown = views.show(_info(chat_template="{% if tools %}{{ tools }}{% endif %}"))
    assert shown["model_info"]["gemma3.context_length"] == 32768 and shown["model_info"]["gemma3.block_count"] == 18
    assert shown["capabilities"] == ["completion", "embedding", "tools"]


def test_ps_entry_expires_when_idle_unloading_would_stop_it():
    memory = (DeviceMemory.of("cuda:0", 100, 20, 5, 1, 1000), DeviceMemory.of("cpu", 50, 0, 0, 0, 1000))
    plan = SimpleNamespace(estimated_bytes=176, context=2048, memory=memory)
    entry = views.ps_entry(_info(), plan, last_used_ago=100.0, idle_unload_seconds=900, pinned=False, now=1_767_225_600.0)
    assert entry["size"] == 176 and entry["size_vram"] == 126 and entry["context_length"] == 2048
    assert entry["expires_at"] == "2026-01-01T00:13:20Z"
    assert "expires_at" not in views.ps_entry(_info(), plan, last_used_ago=0, idle_unload_seconds=900, pinned=True)
