"""Inference backends behind one contract.

A driver turns a plan into the command line of an engine process that serves
OpenAI-shaped HTTP on a private Unix socket. The supervisor
(``appliance.serving.engines``) owns the process; drivers stay pure functions of the
plan, so every argument list is testable without starting anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Driver(Protocol):
    """What the supervisor needs from a backend."""

    name: str
    #: Engine routes the gateway may forward to (an allow-list; nothing else is reachable).
    routes: frozenset[str]
    #: Route that answers 200 once the engine is ready.
    health_path: str
    supports_embeddings: bool

    def command(self, plan: Any, socket_path: Path, settings: Any) -> list[str]:
        """The engine's argv. Pure: no I/O, no environment reads."""

    def environment(self, plan: Any, settings: Any) -> dict[str, str]:
        """Extra environment variables for the engine process."""


def get_driver(backend: str) -> Driver:
    """The driver for a plan's backend name."""
    if backend == "llamacpp":
        from appliance.drivers.llamacpp.driver import LlamaCppDriver

        return LlamaCppDriver()
    if backend == "vllm":
        from appliance.drivers.vllm import VllmDriver

        return VllmDriver()
    raise ValueError(f"unknown backend {backend!r}")
