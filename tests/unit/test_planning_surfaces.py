"""`appliancectl doctor|plan` and `GET /admin/hardware|plan`."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner
from litestar.testing import TestClient

from appliance.api.errors import handle_appliance_error
from appliance.api.planning import PlanningController
from appliance.db.engine import make_engine, migrate
from appliance.errors import ApplianceError
from appliance.modelfacts import ModelFacts
from appliance.settings import load_settings
from appliance.store.store import ModelStore
from tests.appkit import local_admin_app


@pytest.fixture()
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("APPLIANCE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("APPLIANCE_URL", raising=False)
    monkeypatch.delenv("APPLIANCE_CONFIG", raising=False)
    return tmp_path


def run(*args: str) -> tuple[int, str]:
    from appliance.cli import cli

    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def tiny_gguf(path: Path) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    for add, value in (
        (w.add_block_count, 2),
        (w.add_context_length, 4096),
        (w.add_embedding_length, 64),
        (w.add_feed_forward_length, 128),
        (w.add_head_count, 4),
        (w.add_head_count_kv, 2),
    ):
        add(value)
    w.add_file_type(1)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}".encode() for i in range(32)])
    w.add_tensor("token_embd.weight", np.zeros((32, 64), dtype=np.float16))
    for i in range(2):
        w.add_tensor(f"blk.{i}.attn_q.weight", np.zeros((64, 64), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_doctor_tells_the_truth_about_this_box(env: Path) -> None:
    code, out = run("doctor", "--json")
    assert code == 0, out
    report = json.loads(out)
    cpu_text = Path("/proc/cpuinfo").read_text()
    assert report["hardware"]["gpus"] == []
    assert ("avx2" in report["hardware"]["cpu"]["flags"]) == (" avx2" in cpu_text)
    assert ("avx512f" in report["hardware"]["cpu"]["flags"]) == (" avx512f" in cpu_text)
    assert report["hardware"]["cpu"]["memory_total"] > 0
    assert report["software"]["llamacpp_gpu_backends"] == []
    assert any(f["component"] == "nvidia" for f in report["findings"])
    code, text = run("doctor")
    assert code == 0
    assert "GPU:   none usable (CPU only)" in text and "RAM:" in text and "AVX2 " in text


def test_plan_a_local_gguf_file(env: Path) -> None:
    path = tiny_gguf(env / "tiny-f16.gguf")
    code, out = run("plan", str(path), "--ctx", "2048", "--parallel", "2", "--json")
    assert code == 0, out
    report = json.loads(out)
    assert report["plan"]["backend"] == "llamacpp" and report["plan"]["devices"] == ["cpu"]
    assert (report["plan"]["context"], report["plan"]["parallel"]) == (2048, 2)
    assert report["plan"]["model"] == "tiny-f16:f16"
    [row] = report["rows"]
    assert row["fits"] and row["chosen"] and row["memory"][0]["device"] == "cpu"
    code, text = run("plan", str(path))
    assert code == 0 and "Plan: tiny-f16:f16 on llamacpp" in text


def test_plan_a_catalog_model_without_a_daemon(env: Path) -> None:
    code, out = run("plan", "gemma-3-270m", "--json")
    assert code == 0, out
    report = json.loads(out)
    assert report["plan"]["variant"] == "q4_k_m" and report["plan"]["backend"] == "llamacpp"


def test_plan_errors(env: Path) -> None:
    code, out = run("plan", "no-such-model")
    assert code != 0 and "neither installed nor in the catalog" in out
    evil = env / "evil.gguf"
    evil.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (2**64 - 1).to_bytes(8, "little") + bytes(8))
    code, out = run("plan", str(evil))
    assert code != 0 and "tensors (limit" in out


# --------------------------------------------------------------------------- API
class ListedStore(ModelStore):
    """A store whose installed variants are given (the handler receives a ModelStore by injection)."""

    def __init__(self, variants):  # no disk and no database: only list() is asked
        self._variants = variants

    def list(self):
        return self._variants


def client(tmp_path: Path, store: object | None = None) -> TestClient:
    settings = load_settings(data_dir=tmp_path / "data")
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    migrate(settings.db_path)
    services = SimpleNamespace(
        settings=settings, store=store or ModelStore(settings, make_engine(settings.db_path)), db=make_engine(settings.db_path)
    )
    app = local_admin_app([PlanningController], services, exception_handlers={ApplianceError: handle_appliance_error})
    return TestClient(app)


def test_admin_hardware(env: Path) -> None:
    with client(env) as c:
        r = c.get("/admin/hardware")
    assert r.status_code == 200
    body = r.json()
    assert body["hardware"]["gpus"] == [] and body["ok"] is True


def test_admin_plan_for_a_catalog_model(env: Path) -> None:
    with client(env) as c:
        r = c.get("/admin/plan", params={"model": "gemma-3-270m", "ctx": 4096, "parallel": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["context"], body["parallel"]) == (4096, 2)
    assert body["plan"]["model"] == "gemma-3-270m:q4_k_m"
    assert {row["variant"] for row in body["rows"]} >= {"q4_k_m"}


def test_admin_plan_prefers_installed_variants(env: Path) -> None:
    facts = ModelFacts(
        format="gguf",
        architecture="llama",
        n_layer=2,
        n_embd=64,
        n_head=4,
        n_head_kv=2,
        head_dim=16,
        context_length=4096,
        n_ff=128,
        n_vocab=32,
        file_type="F16",
    )
    info = SimpleNamespace(
        family="tiny",
        variant="f16",
        status="ready",
        format="gguf",
        quantization="F16",
        size_bytes=10_000,
        model_facts=facts,
        path="tiny/f16/tiny.gguf",
    )
    broken = SimpleNamespace(
        family="tiny",
        variant="q4",
        status="corrupt",
        format="gguf",
        quantization="Q4_K_M",
        size_bytes=1,
        model_facts=facts,
        path="x",
    )
    store = ListedStore([info, broken])
    with client(env, store) as c:
        body = c.get("/admin/plan", params={"model": "tiny"}).json()
    assert body["plan"]["model"] == "tiny:f16" and body["plan"]["model_path"] == "tiny/f16/tiny.gguf"
    assert [r["variant"] for r in body["rows"]] == ["f16"]


@pytest.mark.parametrize(
    ("params", "status"),
    [
        ({"model": "../../etc/passwd"}, 400),
        ({"model": "gemma-3-270m", "ctx": 0}, 400),
        ({"model": "gemma-3-270m", "parallel": 100000}, 400),
        ({"model": "no-such-model"}, 404),
    ],
)
def test_admin_plan_bad_requests(env: Path, params: dict, status: int) -> None:
    with client(env) as c:
        r = c.get("/admin/plan", params=params)
    assert r.status_code == status, r.text
    assert set(r.json()["error"]) >= {"message", "type", "code"}
