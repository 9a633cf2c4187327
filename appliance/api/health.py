"""Liveness and readiness probes (open: no key needed)."""

from __future__ import annotations

from litestar import Response, get
from sqlalchemy.engine import Engine

from appliance.api.access import Access, requires
from appliance.db.engine import ping
from appliance.errors import ApplianceError
from appliance.jsontypes import JsonObject
from appliance.serving.names import ModelNames


@get("/healthz", summary="Liveness", tags=["health"], sync_to_thread=False, opt=requires(Access.PUBLIC))
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@get("/readyz", summary="Readiness: database reachable and default model installed", tags=["health"], opt=requires(Access.PUBLIC))
async def readyz(db: Engine, names: ModelNames) -> Response[JsonObject]:
    checks: dict[str, str] = {}
    try:
        ping(db)
        checks["database"] = "ok"
    except Exception as exc:  # pragma: no cover - exercised by the reliability suite
        checks["database"] = f"unreachable: {type(exc).__name__}"
    try:
        checks["default_model"] = f"ok ({names.resolve('default').name})"
    except ApplianceError as exc:
        checks["default_model"] = f"missing: {exc.message}"
    except Exception as exc:
        checks["default_model"] = f"missing: {type(exc).__name__}"
    ready = all(v.startswith("ok") for v in checks.values())
    return Response({"status": "ready" if ready else "not ready", "checks": checks}, status_code=200 if ready else 503)
