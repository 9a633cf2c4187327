"""The console's pull form takes a hub spec: the job it starts pulls the quantization named, and its progress
partial shows the hub pull's total."""

from __future__ import annotations

import time
from pathlib import Path

from appliance.accounts.users import create_user
from appliance.app import create_app
from appliance.db import engine as dbmod
from appliance.services import Services
from appliance.settings import Settings
from tests.ggufkit import make_tiny_gguf
from tests.hubkit import HubServer
from tests.storekit import RangeServer
from tests.unit.test_webui_app import _csrf, signed_in


def test_the_console_pull_form_pulls_from_the_hub(tmp_path: Path) -> None:
    model = make_tiny_gguf(tmp_path / "src.gguf")
    with RangeServer() as cdn, HubServer(cdn) as hub:
        hub.add_repo("org/Tiny-GGUF", {"Tiny-Q8_0.gguf": model, "Tiny-F16.gguf": model})
        settings = Settings(
            data_dir=tmp_path / "data", seed_default_model=False, hub_url=hub.url, allow_private_pull_hosts=["127.0.0.1"]
        )
        settings.data_dir.mkdir()
        dbmod.migrate(settings.db_path)
        services = Services(settings)
        create_user(services.db, "alice", "alice-password-1", role="admin")
        client = signed_in(create_app(settings, services=services), "alice")
        try:
            token = _csrf(client.get("/models").text)
            response = client.post("/models/pull", data={"url": "hf:org/Tiny-GGUF:q8_0"}, headers={"X-CSRF-Token": token})
            assert response.status_code == 200, response.text
            assert "tiny:q8_0" in response.text
            job = next(j for j in services.jobs.list() if j.target == "tiny:q8_0")
            deadline = time.monotonic() + 60
            while not job.finished:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert job.state == "done", job.message
            assert job.total_bytes == model.stat().st_size
            assert services.store.get("tiny:q8_0").sha256 and [r["path"] for r in cdn.requests] == [
                "/cdn/org/Tiny-GGUF/Tiny-Q8_0.gguf"
            ]
            refused = client.post("/models/pull", data={"url": "hf:org/Tiny-GGUF:Q2_K"}, headers={"X-CSRF-Token": token})
            assert refused.status_code == 400 and "Q2_K" in refused.text
        finally:
            client.__exit__(None, None, None)
            services.db.dispose()
