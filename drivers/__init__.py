"""Inference backends behind one contract.

A driver turns a plan into the command line of an engine process that serves
OpenAI-shaped HTTP on a private Unix socket. The supervisor
(``appliance.serving.engines``) owns the process; drivers stay pure functions of the
plan, so every argument list is testable without starting anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable


class EnginePlan(Protocol):
    """The plan fields every driver reads (``appliance.planner.types.Plan`` has them).

    Backend-specific fields a plan may lack are read with defaults by the driver that uses them.
    """

    @property
    def model(self) -> str: ...
    @property
    def model_path(self) -> str: ...
    @property
    def context(self) -> int: ...
    @property
    def parallel(self) -> int: ...
    @property
    def threads(self) -> int | None: ...
    @property
    def n_gpu_layers(self) -> int: ...


class EngineSettings(Protocol):
    """The settings drivers read (``appliance.settings.Settings`` has them)."""

    @property
    def vllm_python(self) -> Path | None: ...
    @property
    def ray_address(self) -> str | None: ...
    @property
    def data_dir(self) -> Path: ...


@runtime_checkable
class Driver(Protocol):
    """What the supervisor needs from a backend."""

    name: str
    #: Engine routes the gateway may forward to (an allow-list; nothing else is reachable).
    routes: frozenset[str]
    #: Route that answers 200 once the engine is ready.
    health_path: str

    def command(self, plan: EnginePlan, socket_path: Path, settings: EngineSettings) -> list[str]:
        """The engine's argv. Pure: no I/O, no environment reads."""

    def environment(self, plan: EnginePlan, settings: EngineSettings) -> dict[str, str]:
        """Extra environment variables for the engine process."""

    def client_headers(self, plan: EnginePlan) -> dict[str, str]:
        """Headers every request to the engine must carry (the supervisor's HTTP client sends them)."""


def get_driver(backend: str) -> Driver:
    """The driver for a plan's backend name."""
    if backend == "llamacpp":
        from appliance.drivers.llamacpp.driver import LlamaCppDriver

        return LlamaCppDriver()
    if backend == "vllm":
        from appliance.drivers.vllm import VllmDriver

        return VllmDriver()
    raise ValueError(f"unknown backend {backend!r}")
