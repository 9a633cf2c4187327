"""Loading a model that evicts another asks first, and the evicted row says when and by what.

A real daemon with ``max_loaded_instances = 1`` serves the default model (loaded by an API request);
in headless Chromium an admin presses Load on a second, tiny model. The console asks first, naming
the model it would stop and its requests in flight; dismissing it loads nothing; accepting loads the
tiny model, and the default model's row then reads "evicted HH:MM UTC to load <tiny model>". The
overview flags the default model while it is cold (nothing loaded yet) or evicted, and not once loaded.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from appliance.accounts.users import create_user
from appliance.db.engine import make_engine
from tests.browser.conftest import WIDE, sign_in
from tests.daemon import RunningDaemon, start_daemon
from tests.ggufkit import make_tiny_gguf
from tests.reliability.kit import import_model

pytestmark = [pytest.mark.browser, pytest.mark.slow]

DEFAULT, TINY = "gemma-3-270m:q4_k_m", "evict.me-tiny_2:f32"


@pytest.fixture(scope="module")
def one_slot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    folder = tmp_path_factory.mktemp("evict")
    box = start_daemon(folder, APPLIANCE_MAX_LOADED_INSTANCES="1")
    engine = make_engine(box.data_dir / "appliance.db")
    create_user(engine, "erin", "erin-password-1", role="admin")
    engine.dispose()
    import_model(box, make_tiny_gguf(folder / "tiny.gguf", seed=3), TINY, timeout=60)
    yield box
    box.stop()


def _loaded(box: RunningDaemon) -> set[str]:
    with box.admin() as admin:
        return {i["model"] for i in admin.get("/admin/instances").json()}


def test_load_that_evicts_asks_first_and_the_evicted_row_says_so(chromium, one_slot):
    context = chromium.new_context(viewport={"width": WIDE, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    questions: list[str] = []
    answer = {"accept": False}

    def on_dialog(dialog) -> None:
        questions.append(dialog.message)
        dialog.accept() if answer["accept"] else dialog.dismiss()

    page.on("dialog", on_dialog)
    sign_in(page, one_slot.url, "erin", "erin-password-1")
    assert _loaded(one_slot) == set()  # nothing loaded yet: the overview says the default model is cold
    flag = page.locator("[data-testid=default-model-flag]")
    assert flag.get_attribute("data-state") == "cold" and DEFAULT in flag.inner_text()

    key = one_slot.create_key("evict-user")
    with httpx.Client(base_url=one_slot.url, headers={"Authorization": f"Bearer {key}"}, timeout=300) as api:
        body = {"model": "default", "prompt": "Once upon a time", "max_tokens": 2}
        assert api.post("/v1/completions", json=body).status_code == 200
    assert _loaded(one_slot) == {DEFAULT}
    page.goto(one_slot.url + "/models")
    form = page.locator(f"#installed tr[data-model='{TINY}'] form[hx-post='/models/load']")
    load = form.locator("button")
    assert form.get_attribute("data-evicts") == DEFAULT

    load.click()  # dismissed: nothing happens
    page.wait_for_timeout(1000)
    assert len(questions) == 1, questions
    assert DEFAULT in questions[0] and "0 requests in flight" in questions[0], questions[0]
    assert _loaded(one_slot) == {DEFAULT}

    answer["accept"] = True
    load.click()
    status = page.locator(f"#installed tr[data-model='{DEFAULT}'] [data-testid=evicted-by]")
    status.wait_for(timeout=120_000)  # live, over the page's load stream, as soon as it is stopped
    page.wait_for_selector(f"#installed tr[data-model='{TINY}'] .badge.ok", timeout=120_000)
    assert _loaded(one_slot) == {TINY}
    assert re.fullmatch(rf"evicted \d\d:\d\d UTC to load {re.escape(TINY)}", status.inner_text().strip()), status.inner_text()
    page.reload()  # a page rendered afterwards says the same
    assert page.locator(f"#installed tr[data-model='{DEFAULT}'] [data-testid=evicted-by]").inner_text().strip().endswith(TINY)
    page.goto(one_slot.url + "/")  # the overview flags the evicted default model
    assert flag.get_attribute("data-state") == "evicted" and DEFAULT in flag.inner_text() and TINY in flag.inner_text()
    page.goto(one_slot.url + "/models")
    # the tiny model is loaded: loading the default model again would evict it, and asks so
    page.locator(f"#installed tr[data-model='{DEFAULT}'] form[hx-post='/models/load'] button").click()
    page.wait_for_selector(f"#installed tr[data-model='{DEFAULT}'] .badge.ok", timeout=120_000)
    assert len(questions) == 3 and TINY in questions[2], questions
    page.goto(one_slot.url + "/")
    assert page.locator("[data-testid=default-model-flag]").count() == 0  # loaded: nothing to flag
    context.close()
    assert not errors, errors
