"""The models page and the playground, live, in headless Chromium against the real daemon.

A load started from the console streams its phases and plan onto the model's
row and ends "loaded" with measured memory; a load that fails (a GGUF missing a
tensor) shows llama.cpp's reason on the row; the catalog search narrows the
list in place; pulling a variant that does not fit asks first; base models are
labelled and get text completion in the playground; Stop ends a running answer
(the ledger and the metrics record the request as abandoned and the engine's
slots are free again); Enter sends, Shift+Enter does not; a repeated
temperature-0 prompt is answered from the exact cache and says so.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator

import pytest

from tests.browser.conftest import USERS, WIDE, Session, sign_in
from tests.daemon import RunningDaemon
from tests.ggufkit import make_tiny_gguf
from tests.reliability.kit import import_model

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHAT_TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}<|assistant|>"
CHAT_MODEL, BROKEN_MODEL = "livechat:f32", "livebroken:f32"
RECORD_PHASES = """
document.addEventListener("htmx:sseOpen", () => { window.__sseOpen = (window.__sseOpen || 0) + 1; });
window.__phases = [];
new MutationObserver(() => {
  document.querySelectorAll("[data-testid=load-status]").forEach((el) => {
    const row = el.closest("tr");
    const entry = (row ? row.dataset.model : "?") + "=" + el.dataset.phase;
    if (window.__phases[window.__phases.length - 1] !== entry) window.__phases.push(entry);
  });
}).observe(document, {childList: true, subtree: true});
"""


@pytest.fixture(scope="module")
def models(console_daemon: RunningDaemon, tmp_path_factory: pytest.TempPathFactory) -> RunningDaemon:
    folder = tmp_path_factory.mktemp("live-models")
    with console_daemon.admin() as admin:
        installed = {m["name"] for m in admin.get("/admin/models/").json()}
    if CHAT_MODEL not in installed:
        import_model(
            console_daemon, make_tiny_gguf(folder / "live-chat.gguf", chat_template=CHAT_TEMPLATE, seed=7), CHAT_MODEL, timeout=60
        )
    if BROKEN_MODEL not in installed:
        import_model(
            console_daemon,
            make_tiny_gguf(folder / "live-broken.gguf", seed=8, omit_tensors=("blk.1.ffn_down.weight",)),
            BROKEN_MODEL,
            timeout=60,
        )
    return console_daemon


@pytest.fixture
def browser_session(chromium: object, models: RunningDaemon) -> Iterator[callable]:
    """Like ``signed_in``, but the test decides what each confirmation dialog gets, and load phases are recorded."""
    made: list[Session] = []

    def make(
        username: str = "alice", dialogs: list[str] | None = None, accept: bool = True, expected_status: int | None = None
    ) -> Session:
        """``expected_status``: an HTTP error the test provokes on purpose (Chromium logs it as a console error)."""
        context = chromium.new_context(viewport={"width": WIDE, "height": 900})
        page = context.new_page()
        session = Session(page=page, context=context, base=models.url)
        expected = f"the server responded with a status of {expected_status} " if expected_status else None

        def console(message) -> None:
            if message.type == "error" and not (expected and expected in message.text):
                session.errors.append(f"console.{message.type}: {message.text}")

        page.on("console", console)
        page.on("pageerror", lambda e: session.errors.append(f"pageerror: {e}"))

        def answer(dialog) -> None:
            if dialogs is not None:
                dialogs.append(dialog.message)
            dialog.accept() if accept else dialog.dismiss()

        page.on("dialog", answer)
        page.add_init_script(RECORD_PHASES)
        sign_in(page, models.url, username, USERS[username][1])
        made.append(session)
        return session

    yield make
    problems = [e for s in made for e in s.errors]
    for s in made:
        s.context.close()
    assert not problems, "the console logged errors:\n" + "\n".join(problems)


def _open(s: Session, path: str, *, streams: int = 0) -> None:
    """Open a page; with ``streams``, wait until that many SSE streams are open (they keep the network busy)."""
    s.page.goto(s.base + path)
    s.page.wait_for_load_state("load")
    if streams:
        s.page.wait_for_function(f"() => (window.__sseOpen || 0) >= {streams}", timeout=15_000)


def _row(model: str) -> str:
    return f"#installed tr[data-model='{model}']"


def _unload(daemon: RunningDaemon, model: str) -> None:
    with daemon.admin() as admin:
        admin.post(f"/admin/instances/{model}/unload")


def _ledger(daemon: RunningDaemon) -> list[tuple]:
    with sqlite3.connect(daemon.data_dir / "appliance.db") as db:
        return db.execute("SELECT request_id, status, completion_tokens, model FROM usage ORDER BY id").fetchall()


def test_a_load_streams_its_phases_and_plan_to_the_row_and_ends_loaded(browser_session, models):
    _unload(models, CHAT_MODEL)
    s = browser_session("otto")
    _open(s, "/models", streams=1)
    row = _row(CHAT_MODEL)
    s.page.click(f"{row} form[hx-post='/models/load'] button")
    s.page.wait_for_selector(f"{row} [data-testid=load-status][data-phase=loaded]", timeout=60_000)
    phases = [p.split("=", 1)[1] for p in s.page.evaluate("window.__phases") if p.startswith(CHAT_MODEL + "=")]
    assert "starting" in phases and phases[-1] == "loaded", phases  # streamed while loading, not only drawn at the end
    plan = s.page.inner_text(f"{row} [data-testid=load-plan]")
    assert "llamacpp" in plan and "f32" in plan and "ctx" in plan and "CPU only" in plan, plan
    memory = s.page.inner_text(f"{row} [data-testid=load-memory]")
    assert "estimated" in memory and "measured" in memory, memory
    assert s.page.locator(f"{row} .badge.ok", has_text="loaded").count() == 1
    s.shoot("models-load-live")


def test_a_load_started_elsewhere_shows_on_the_open_page(browser_session, models):
    _unload(models, CHAT_MODEL)
    s = browser_session("victor")  # a viewer watches; the API loads
    _open(s, "/models", streams=1)
    with models.admin() as admin:
        assert admin.post(f"/admin/instances/{CHAT_MODEL}/load").status_code in (200, 201)
    s.page.wait_for_selector(f"{_row(CHAT_MODEL)} [data-testid=load-status][data-phase=loaded]", timeout=60_000)


def test_a_failed_load_shows_its_reason_on_the_row(browser_session):
    s = browser_session("otto", expected_status=503)  # the Load button's answer: the engine is unavailable
    _open(s, "/models", streams=1)
    row = _row(BROKEN_MODEL)
    s.page.click(f"{row} form[hx-post='/models/load'] button")
    s.page.wait_for_selector(f"{row} [data-testid=load-status][data-phase=failed]", timeout=60_000)
    reason = s.page.inner_text(f"{row} [data-testid=load-error]")
    assert "exited during load" in reason and "corrupt or unsupported GGUF" in reason, reason
    # the Load button's own answer lands next to the button, in a live region, even though the row was re-rendered
    feedback = s.page.locator(f"{row} form[hx-post='/models/load'] + .feedback[role=status]")
    feedback.wait_for(timeout=10_000)
    assert "exited during load" in feedback.inner_text()
    _open(s, "/models", streams=1)  # the reason stays on the row after a reload
    assert "during load" in s.page.inner_text(f"{row} [data-testid=load-error]")
    s.shoot("models-load-failed")


def test_catalog_search_narrows_the_list_in_place(browser_session):
    s = browser_session("alice")
    _open(s, "/models", streams=1)
    families = s.page.locator("#catalog details.family")
    everything = families.count()
    assert everything > 3
    s.page.fill("[data-testid=catalog-q]", "270m")
    s.page.wait_for_function("() => document.querySelectorAll('#catalog details.family').length === 1")
    assert families.first.get_attribute("data-family") == "gemma-3-270m"
    assert s.page.evaluate("window.__sseOpen") == 1  # narrowed in place: the page was not reloaded
    s.page.select_option("[data-testid=catalog-format]", "safetensors")
    s.page.wait_for_function(
        "() => { const cells = [...document.querySelectorAll('#catalog tr[data-variant] td:nth-child(2)')];"
        " return cells.length > 0 && cells.every((c) => c.textContent.trim().startsWith('safetensors')) }"
    )
    s.page.fill("[data-testid=catalog-q]", "no-such-model")
    s.page.wait_for_selector("[data-testid=catalog-empty]")
    s.page.select_option("[data-testid=catalog-format]", "")
    s.page.fill("[data-testid=catalog-q]", "")
    s.page.check("[data-testid=catalog-fits]")
    s.page.wait_for_function(
        f"() => {{ const n = document.querySelectorAll('#catalog details.family').length; return n > 0 && n < {everything} }}"
    )
    badges = s.page.locator("#catalog tr[data-variant] .badge[class*=fit-]").all_inner_texts()
    assert badges and all(b in ("fits", "tight fit") for b in badges), badges
    s.shoot("models-catalog-search")


def test_pulling_a_variant_that_does_not_fit_asks_first(browser_session):
    dialogs: list[str] = []
    s = browser_session("alice", dialogs=dialogs, accept=False)
    _open(s, "/models?q=70b", streams=1)
    warned = s.page.locator("#catalog tr[data-variant]:has([data-testid=pull-warning])").first
    name = warned.get_attribute("data-variant")
    jobs_before = s.page.locator("#jobs [data-testid^=job-]").count()
    warned.locator("[data-testid=catalog-pull]").click()
    s.page.wait_for_timeout(500)
    assert dialogs and name in dialogs[0] and "does not fit" in dialogs[0], dialogs
    assert s.page.locator("#jobs [data-testid^=job-]").count() == jobs_before  # refused: nothing was pulled


def test_base_models_are_labelled_and_get_text_completion(browser_session):
    s = browser_session("otto")
    _open(s, "/models", streams=1)
    assert s.page.locator(f"{_row('gemma-3-270m:q4_k_m')} [data-testid=base-badge]").count() == 1
    assert s.page.locator(f"{_row(CHAT_MODEL)} [data-testid=base-badge]").count() == 0
    assert s.page.locator("#catalog details[data-family=gemma-3-270m] [data-testid=base-badge]").count() == 1
    _open(s, "/playground")
    assert s.page.is_visible("[data-testid=playground-hint]")
    s.page.select_option("[data-testid=model]", CHAT_MODEL)
    assert s.page.is_checked("[data-testid=mode-chat]")
    s.page.select_option("[data-testid=model]", "default")
    assert s.page.is_checked("[data-testid=mode-completion]") and s.page.is_visible("[data-testid=base-note]")
    assert "(base)" in s.page.inner_text("[data-testid=model] option[value=default]")
    s.shoot("playground-base-model")


def _set(s: Session, model: str, *, temperature: str, max_tokens: str) -> None:
    s.page.select_option("[data-testid=model]", model)
    s.page.fill("input[name=temperature]", temperature)
    s.page.fill("[data-testid=max-tokens]", max_tokens)


def test_enter_sends_and_a_repeated_temperature_0_prompt_is_an_exact_cache_hit(browser_session):
    s = browser_session("otto")
    _open(s, "/playground")
    _set(s, "default", temperature="0", max_tokens="8")
    prompt = s.page.locator("[data-testid=prompt]")
    prompt.click()
    prompt.type("Once upon")
    prompt.press("Shift+Enter")
    prompt.type("a time")
    assert prompt.input_value() == "Once upon\na time" and s.page.locator("[data-testid=assistant-turn]").count() == 0
    prompt.press("Enter")
    done = s.page.locator("[data-testid=usage-done]")
    done.first.wait_for(timeout=120_000)
    assert s.page.inner_text("[data-testid=cache-tier] >> nth=0") == "miss"
    assert "stopped at max tokens" in s.page.inner_text("[data-testid=usage-line] >> nth=0")  # 8 tokens, finish_reason length
    prompt.type("Once upon")
    prompt.press("Shift+Enter")
    prompt.type("a time")
    prompt.press("Enter")
    s.page.wait_for_function("() => document.querySelectorAll('[data-testid=usage-done]').length === 2", timeout=120_000)
    assert s.page.inner_text("[data-testid=cache-tier] >> nth=1") == "exact"
    texts = s.page.locator("[data-testid=assistant-text]").all_inner_texts()
    assert texts[0] == texts[1] and texts[0].strip()


def test_stop_cancels_the_running_request(browser_session, models):
    s = browser_session("otto")
    _open(s, "/playground")
    _set(s, "default", temperature="0.9", max_tokens="4000")
    s.page.fill("[data-testid=prompt]", "Here is a very long story about the sea. Chapter one.")
    before = {row[0] for row in _ledger(models)}
    s.page.click("[data-testid=send]")
    s.page.wait_for_function(
        "() => { const t = document.querySelector('[data-testid=assistant-text]'); return t && t.textContent.length > 20 }",
        timeout=120_000,
    )
    s.page.click("[data-testid=stop]")
    s.page.locator("[data-testid=stopped]").wait_for(timeout=15_000)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (new := [r for r in _ledger(models) if r[0] not in before]):
        time.sleep(0.2)
    assert len(new) == 1, new
    _, status, completion_tokens, model = new[0]
    assert status == 499 and 0 < completion_tokens < 4000 and model == "gemma-3-270m:q4_k_m", new
    with models.admin() as admin:
        deadline = time.monotonic() + 5
        while True:  # the engine's sequence slot is free again: it stopped generating
            metrics = admin.get("/metrics").text
            busy = [
                line for line in metrics.splitlines() if line.startswith('appliance_kv_slots_in_use{model="gemma-3-270m:q4_k_m"}')
            ]
            if busy and busy[0].rsplit(" ", 1)[1] in ("0", "0.0") or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert busy and busy[0].rsplit(" ", 1)[1] in ("0", "0.0"), busy
    assert 'appliance_requests_total{model="gemma-3-270m:q4_k_m",status="499"' in metrics
