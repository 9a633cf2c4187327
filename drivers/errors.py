"""Errors a driver raises in the daemon while it turns a plan into an engine's command line."""

from __future__ import annotations


class PlanNotServable(ValueError):
    """The plan asks for something vLLM cannot do (a planner bug, reported at load)."""
