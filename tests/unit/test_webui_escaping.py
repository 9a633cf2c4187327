"""Model metadata, user input and chart labels are always escaped in console HTML."""

from __future__ import annotations

from types import SimpleNamespace

from appliance.serving.load_events import LoadEvent, LoadPlanSummary
from appliance.webui import charts
from appliance.webui.fit import Fit
from appliance.webui.render import environment, render

EVIL = '<script>alert(1)</script><img src=x onerror="alert(2)">'


def _variant(**overrides):
    base = dict(
        name=f"fam:{EVIL}",
        family="fam",
        variant=EVIL,
        format="gguf",
        quantization=EVIL,
        size_bytes=1,
        status="ready",
        is_default=False,
        parent=EVIL,
        facts={"architecture": EVIL, "chat_template": EVIL},
    )
    base.update(overrides)
    return SimpleNamespace(**base)


def _assert_inert(html: str) -> None:
    assert "<script>" not in html and "<img" not in html
    assert "&lt;script&gt;" in html


def test_autoescape_is_on_for_every_template():
    assert environment().autoescape is True


def test_installed_models_table_escapes_names_and_chat_templates():
    plan = LoadPlanSummary(
        backend=EVIL, variant=EVIL, context=512, parallel=1, devices=(EVIL,), n_gpu_layers=-1, estimated_bytes=1, reason=EVIL
    )
    load = LoadEvent(f"fam:{EVIL}", "failed", 0.0, plan=plan, error=EVIL)
    row = {
        "info": _variant(),
        "loaded": True,
        "pinned": False,
        "state": EVIL,
        "fit": Fit("no", EVIL, EVIL),
        "base": True,
        "load": load,
        "load_event": "load-0",
        "appliance_default": False,
        "current_default": EVIL,
    }
    html = render("_installed.html", rows=[row], message=EVIL, can_operate=True, is_admin=True, csrf="t")
    _assert_inert(html)
    assert 'data-testid="load-error"' in html


def test_playground_turn_and_usage_line_escape_prompt_and_model():
    html = render("_turn.html", turn_id="abc", prompt=EVIL, mode="completion", model=EVIL)
    _assert_inert(html)
    stats = {
        "model": EVIL,
        "tier": EVIL,
        "prompt_tokens": 1,
        "completion_tokens": 2,
        "ttft": "840 ms",
        "cached": False,
        "tokens_per_s": 3.0,
        "seconds": "1.0 s",
        "empty": False,
        "stopped": False,
        "at_max_tokens": True,
    }
    _assert_inert(render("_usage_line.html", s=stats))


def test_alerts_and_job_rows_escape_messages():
    _assert_inert(render("_alert.html", kind="error", message=EVIL))
    job = {
        "id": 1,
        "kind": "pull",
        "target": EVIL,
        "state": "failed",
        "progress": 0.5,
        "done_bytes": 1,
        "total_bytes": 2,
        "message": EVIL,
        "error": {"message": EVIL},
    }
    _assert_inert(render("_job_body.html", job=job))


def test_charts_escape_labels_and_ignore_junk_values():
    spark = str(charts.sparkline([1, "x", None, 3], label=EVIL, css=EVIL))
    assert "<script>" not in spark and "&lt;script&gt;" in spark
    bars = str(charts.bars([(EVIL, 5), ("b", 0)], label=EVIL))
    assert "<script>" not in bars and "&lt;script&gt;" in bars
    assert "<svg" in str(charts.meter(5, 10))
