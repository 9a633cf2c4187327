"""``latency_targets`` in the settings reaches the worker's command line, and the worker reads it back."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from appliance.drivers.llamacpp.driver import LlamaCppDriver, latency_args
from appliance.drivers.llamacpp.worker import parse_args
from appliance.settings import Settings


class Plan:
    model_path, model, context, parallel, threads, n_gpu_layers = "/m.gguf", "m", 2048, 8, 2, 0


def test_defaults_and_a_partial_override_reach_the_worker(tmp_path):
    settings = Settings(data_dir=tmp_path, latency_targets={"batch": {"ttft_p95_s": 60}})
    assert settings.latency_targets == {
        "interactive": {"ttft_p95_s": 2.0, "tpot_p95_s": 0.15},
        "batch": {"ttft_p95_s": 60.0, "tpot_p95_s": 0.5},
    }
    argv = LlamaCppDriver().command(Plan(), tmp_path / "w.sock", settings)
    i = argv.index("--latency-targets")
    assert argv[i + 1] == "interactive:2:0.15,batch:60:0.5"
    targets = parse_args(argv[3:]).latency_targets
    assert (targets.of("batch").ttft_s, targets.of("interactive").tpot_s) == (60.0, 0.15)


@pytest.mark.parametrize(
    "value",
    [
        {"batch": {"ttft_p95_s": -1}},
        {"interactive": {"tpot_p95_s": 0}},
        {"realtime": {"ttft_p95_s": 1}},
        {"interactive": {"ttft_p99_s": 1}},
        {"interactive": {"ttft_p95_s": 1e9}},
    ],
)
def test_nonsense_targets_are_refused(tmp_path, value):
    with pytest.raises(ValidationError):
        Settings(data_dir=tmp_path, latency_targets=value)


def test_no_settings_no_flag():
    assert latency_args(None) == []
