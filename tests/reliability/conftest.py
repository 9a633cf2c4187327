"""A daemon shared by the engine-fault and disconnect tests: the tiny model with a long context.

The tiny random-weight model generates thousands of tokens a second; with
16k-token slots a request runs for seconds, long enough to kill its engine or
hang up on it mid-way.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.daemon import RunningDaemon
from tests.ggufkit import make_tiny_gguf
from tests.reliability.kit import TINY, import_model, start_daemon

# A chat template of its own, so no fallback template's stop strings cut the random text short.
TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"
LONG = 12000  # max_tokens of a request that should still be running when the test acts


@pytest.fixture(scope="session")
def long_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_gguf(tmp_path_factory.mktemp("models") / "tiny-long.gguf", ctx=16384, chat_template=TEMPLATE)


@pytest.fixture(scope="session")
def long_box(tmp_path_factory: pytest.TempPathFactory, long_gguf: Path):
    daemon = start_daemon(tmp_path_factory.mktemp("faults"), APPLIANCE_ENGINE_CONTEXT="16384", APPLIANCE_ENGINE_PARALLEL="2")
    try:
        import_model(daemon, long_gguf, TINY)
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture(scope="session")
def long_key(long_box: RunningDaemon) -> str:
    return long_box.create_key("faults")
