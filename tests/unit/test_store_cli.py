"""`appliancectl models ...` against the store API in-process (the admin client swapped for a TestClient)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from litestar.testing import TestClient

from appliance.store.jobs import JobRegistry
from tests.storekit import RangeServer, make_app, make_store, sha256_file


@pytest.fixture()
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    import appliance.cli.client as client_mod
    import appliance.cli.models as models_mod
    from appliance.cli import cli as root

    monkeypatch.setenv("APPLIANCE_DATA_DIR", str(tmp_path / "data"))
    store = make_store(tmp_path / "data", allow_private_pull_hosts=["127.0.0.1"])
    jobs = JobRegistry()
    app = make_app(store, jobs)
    factory = lambda ctx, timeout=600.0: TestClient(app)  # noqa: E731
    monkeypatch.setattr(client_mod, "admin_client", factory)
    monkeypatch.setattr(models_mod, "admin_client", factory)
    yield root
    jobs.shutdown()


def run(root: object, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(root, list(args), catch_exceptions=False)  # type: ignore[arg-type]
    return result.exit_code, result.output


def test_import_ls_inspect_verify_rm(cli: object, tiny_gguf: Path) -> None:
    code, out = run(cli, "models", "import", str(tiny_gguf), "--name", "tiny:f32")
    assert code == 0, out
    assert "Imported tiny:f32: ready" in out and sha256_file(tiny_gguf) in out
    code, out = run(cli, "models", "ls")
    assert code == 0 and "tiny:f32" in out and "F32" in out
    code, out = run(cli, "models", "ls", "--json")
    assert json.loads(out)[0]["name"] == "tiny:f32"
    code, out = run(cli, "models", "inspect", "tiny:f32")
    assert code == 0 and "llama" in out and "n_layer" in out
    code, out = run(cli, "models", "verify", "tiny:f32")
    assert code == 0 and "verified" in out
    code, out = run(cli, "models", "rm", "tiny:f32", "--yes")
    assert code == 0 and "Deleted tiny:f32." in out
    code, out = run(cli, "models", "inspect", "tiny:f32")
    assert code == 1 and "does not exist" in out and "HTTP 404" in out


def test_pull_shows_progress_and_result(cli: object, tmp_path: Path) -> None:
    from tests.ggufkit import make_tiny_gguf

    src = make_tiny_gguf(tmp_path / "src.gguf", vocab=2048)
    with RangeServer() as server:
        url = server.add("Tiny-Q8_0.gguf", src)
        code, out = run(cli, "models", "pull", url, "--sha256", sha256_file(src))
    assert code == 0, out
    assert "Pulled tiny:q8_0: ready" in out


def test_quantize_and_refusals(cli: object, tiny_gguf: Path) -> None:
    assert run(cli, "models", "import", str(tiny_gguf), "--name", "tiny:f32")[0] == 0
    code, out = run(cli, "models", "quantize", "tiny:f32", "--to", "q8_0")
    assert code == 0 and "Made tiny:q8_0" in out, out
    code, out = run(cli, "models", "ls")
    assert "tiny:f32" in out and "tiny:q8_0" in out
    code, out = run(cli, "models", "pull", "http://127.0.0.1:1/../../etc/passwd", "--name", "../evil")
    assert code == 1 and "invalid" in out
    code, out = run(cli, "models", "rm", "tiny", "--yes")
    assert code == 1 and "family:variant" in out
