"""Liveness and readiness probes (open: no key needed)."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get

from appliance.db import engine as dbmod
from appliance.api.access import Access, requires


@get("/healthz", summary="Liveness", tags=["health"], sync_to_thread=False, opt=requires(Access.PUBLIC))
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@get("/readyz", summary="Readiness: database reachable and default model installed", tags=["health"], opt=requires(Access.PUBLIC))
async def readyz(request: Request) -> Response[dict[str, Any]]:
    services = getattr(request.app.state, "services", None)
    checks: dict[str, str] = {}
    if services is None or services.store is None:
        return Response({"status": "starting", "checks": {"startup": "in progress"}}, status_code=503)
    try:
        dbmod.ping(services.db)
        checks["database"] = "ok"
    except Exception as exc:  # pragma: no cover - exercised by the reliability suite
        checks["database"] = f"unreachable: {type(exc).__name__}"
    try:
        name = services.canonical_name("default")
        checks["default_model"] = f"ok ({name})"
    except Exception as exc:
        checks["default_model"] = f"missing: {getattr(exc, 'message', type(exc).__name__)}"
    ready = all(v.startswith("ok") for v in checks.values())
    return Response({"status": "ready" if ready else "not ready", "checks": checks}, status_code=200 if ready else 503)
