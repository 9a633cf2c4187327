"""The real daemon (gateway, auth, metering, cache, router, supervisor) serving one stand-in engine.

Used by bench_gateway_overhead.py: everything is the product's code except the
engine, which answers instantly, so the latency measured is the gateway's own.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from appliance.allocator import jemalloc_loaded, restore_preload
from appliance.daemon import check_data_dir
from appliance.db import engine as dbmod
from appliance.heap import map_large_blocks
from appliance.lockfile import DataDirLock
from appliance.logs import setup_logging
from appliance.serving.engines import EngineProcess
from appliance.settings import load_settings

ECHO = Path(__file__).with_name("echo_engine.py")


@dataclass(frozen=True)
class EchoPlan:
    model: str = "echo:instant"
    backend: str = "echo"
    parallel: int = 256
    context: int = 512
    estimated_bytes: int = 0
    n_gpu_layers: int = 0
    model_path: str = ""  # no file: nothing to calibrate or count prompts with
    variant: str = "instant"
    devices: tuple[str, ...] = ("cpu",)
    reason: str = "a stand-in engine that answers at once"


ECHO_VARIANT = SimpleNamespace(name="echo:instant", family="echo", variant="instant", file=None)


class EchoDriver:
    name = "echo"
    routes = frozenset({"/v1/chat/completions", "/v1/completions"})
    health_path = "/health"

    def client_headers(self, plan):
        return {}

    def command(self, plan, socket_path, settings):
        tcp = os.environ.get("ECHO_ENGINE_TCP_PORT")  # the benchmark's load generator reaches the engine alone there
        return [sys.executable, str(ECHO), "--socket", str(socket_path), *(["--tcp-port", tcp] if tcp else [])]

    def environment(self, plan, settings):
        return {}


def main() -> None:
    import appliance.daemon as daemon
    import appliance.services as services_mod
    import appliance.serving.names as names_mod

    restore_preload()  # started with jemalloc preloaded, as the daemon re-executes itself: the engine gets neither
    if not jemalloc_loaded():
        map_large_blocks()
    settings = load_settings()
    check_data_dir(settings)
    setup_logging("warning", "json", settings.log_dir)
    lock = DataDirLock(settings.lock_path)
    lock.acquire()
    dbmod.migrate(settings.db_path)

    # Every name means the stand-in variant; its plan starts the echo engine.
    names_mod.ModelNames.resolve = lambda self, requested: ECHO_VARIANT
    services_mod.Services._plan = lambda self, target: EchoPlan()
    services_mod.Services._engine = lambda self, name, plan: EngineProcess(
        name, plan, EchoDriver(), self.settings, self.settings.run_dir / "echo.sock"
    )
    daemon.run_loop(daemon.serve(settings))


if __name__ == "__main__":
    main()
