"""Latency targets per priority class: time to first token and time per output token, both p95.

The daemon hands them to the worker as ``--latency-targets
interactive:2:0.15,batch:30:0.5`` (class, TTFT seconds, TPOT seconds); a request
names its class in the ``x-appliance-priority`` header (``interactive`` when absent
or unknown). The step planner (:mod:`.step_planner`) reads them.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from appliance.jsontypes import JsonObject

#: The classes, most urgent first (the daemon's key priorities).
PRIORITIES = ("interactive", "batch")
#: The request header naming a request's class (ASGI spells header names in lower case bytes).
PRIORITY_HEADER = b"x-appliance-priority"


@dataclass(frozen=True)
class ClassTarget:
    ttft_s: float
    tpot_s: float


DEFAULT_TARGETS = {"interactive": ClassTarget(2.0, 0.15), "batch": ClassTarget(30.0, 0.5)}


class LatencyTargets:
    """The target of each class and its rank (0 is the most urgent)."""

    def __init__(self, targets: dict[str, ClassTarget] | None = None) -> None:
        self._targets = {**DEFAULT_TARGETS, **(targets or {})}

    def rank(self, priority: str) -> int:
        return PRIORITIES.index(priority) if priority in PRIORITIES else 0

    def of(self, priority: str) -> ClassTarget:
        return self._targets.get(priority, self._targets["interactive"])

    @property
    def tightest_tpot_s(self) -> float:
        """The shortest time-per-output-token target of any class."""
        return min(t.tpot_s for t in self._targets.values())

    def as_arg(self) -> str:
        return ",".join(f"{p}:{t.ttft_s:g}:{t.tpot_s:g}" for p, t in self._targets.items())


def priority_of(scope: JsonObject) -> str:
    """The class an ASGI request names in its ``x-appliance-priority`` header; ``interactive`` when absent or unknown."""
    for name, value in scope.get("headers") or ():
        if name == PRIORITY_HEADER:
            text = value.decode("latin-1").strip().lower()
            return text if text in PRIORITIES else PRIORITIES[0]
    return PRIORITIES[0]


def parse_targets(text: str) -> LatencyTargets:
    """``class:ttft_s:tpot_s`` entries, comma-separated; classes not named keep their defaults."""
    targets: dict[str, ClassTarget] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        fields = part.split(":")
        if len(fields) != 3 or fields[0] not in PRIORITIES:
            raise argparse.ArgumentTypeError(f"expected CLASS:TTFT_S:TPOT_S with CLASS one of {', '.join(PRIORITIES)}: {part!r}")
        try:
            ttft, tpot = float(fields[1]), float(fields[2])
        except ValueError:
            raise argparse.ArgumentTypeError(f"not numbers of seconds: {part!r}") from None
        if not (0 < ttft < 86400 and 0 < tpot < 3600):
            raise argparse.ArgumentTypeError(f"targets must be positive seconds: {part!r}")
        targets[fields[0]] = ClassTarget(ttft, tpot)
    return LatencyTargets(targets)
