"""The models page with variants available on the hub, in headless Chromium against the real daemon: they show
their state, size and fit, fit 1280 and 390 px with the long sources real repositories have, and their Pull button
downloads them."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.browser.conftest import USERS, Session, _watch, sign_in
from tests.daemon import RunningDaemon, start_daemon
from tests.ggufkit import make_tiny_gguf
from tests.hubkit import HubServer
from tests.storekit import RangeServer

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = "bartowski/Qwen2.5-0.5B-Instruct-GGUF"  # the long names of a real repository
STEM = "Qwen2.5-0.5B-Instruct"


@pytest.fixture(scope="module")
def hub_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    from appliance.accounts.users import create_user
    from appliance.db.engine import make_engine

    base = tmp_path_factory.mktemp("hub-variants-page")
    files = {
        f"{STEM}-{quant}.gguf": make_tiny_gguf(base / "src" / f"{quant}.gguf", seed=seed)
        for seed, quant in enumerate(("Q8_0", "Q4_K_M", "IQ4_XS"))
    }
    with RangeServer() as cdn, HubServer(cdn) as hub:
        hub.add_repo(REPO, files)
        running = start_daemon(base, APPLIANCE_HUB_URL=hub.url, APPLIANCE_ALLOW_PRIVATE_PULL_HOSTS='["127.0.0.1"]')
        try:
            engine = make_engine(running.data_dir / "appliance.db")
            create_user(engine, "alice", USERS["alice"][1], role="admin")
            engine.dispose()
            with running.admin() as admin:
                job = admin.post("/admin/models/pull", json={"url": f"hf:{REPO}:q8_0"}).json()
                deadline = time.monotonic() + 120
                while admin.get(f"/admin/jobs/{job['id']}").json()["state"] != "done":
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
            yield running
        finally:
            running.stop()


def _state(daemon: RunningDaemon, name: str) -> str:
    with daemon.admin() as admin:
        return str(admin.get(f"/admin/models/{name}").json()["status"])


def test_available_variants_show_fit_and_are_pulled_from_their_row(chromium: object, hub_daemon: RunningDaemon) -> None:
    context = chromium.new_context(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
    page = context.new_page()
    s = Session(page=page, context=context, base=hub_daemon.url)
    _watch(page, s.errors)
    sign_in(page, hub_daemon.url, "alice", USERS["alice"][1])
    try:
        s.goto("/models")
        row = page.locator('tr[data-model="qwen2.5-0.5b-instruct:iq4_xs"]')
        assert row.locator(".badge.state-available").inner_text() == "available"
        assert row.locator("[class*=fit-]").first.inner_text() in ("fits", "tight fit")
        assert f"hf:{REPO}/{STEM}-IQ4_XS.gguf" in row.inner_text()
        assert row.locator("button", has_text="Load").count() == 0 and row.locator("button", has_text="Make default").count() == 0
        ready = page.locator('tr[data-model="qwen2.5-0.5b-instruct:q8_0"]')
        assert ready.locator(".badge.state-ready").inner_text() == "ready"
        s.shoot("models-available")  # no horizontal overflow at 1280 or 390 px

        row.locator("button", has_text="Pull").click()
        page.locator("#jobs").get_by_text("qwen2.5-0.5b-instruct:iq4_xs").first.wait_for(timeout=30_000)
        deadline = time.monotonic() + 120
        while _state(hub_daemon, "qwen2.5-0.5b-instruct:iq4_xs") != "ready":
            assert time.monotonic() < deadline
            time.sleep(0.2)
        s.goto("/models")
        pulled = page.locator('tr[data-model="qwen2.5-0.5b-instruct:iq4_xs"]')
        assert pulled.locator(".badge.state-ready").inner_text() == "ready"
        assert pulled.locator("button", has_text="Load").count() == 1
    finally:
        context.close()
    assert not s.errors, s.errors
