"""The Litestar application: wiring only. Services are built in the lifespan and handed to handlers by DI."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from litestar import Litestar, Router
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.openapi.spec import Components, OpenAPIMediaType, OpenAPIResponse, OpenAPIType, Reference, Schema, SecurityScheme
from litestar.types import ControllerRouterHandler

from appliance import __version__
from appliance.api.access import Access, AccessGuard, requires
from appliance.api.admin import AliasesController, InstancesController, KeysController, OpsController
from appliance.api.anthropic import AnthropicController
from appliance.api.audit import AuditController
from appliance.api.batches import BatchesController
from appliance.api.cache import CacheController
from appliance.api.dependencies import dependencies
from appliance.api.edge import ApplianceASGI
from appliance.api.errors import EXCEPTION_HANDLERS
from appliance.api.files import FilesController
from appliance.api.health import healthz, readyz
from appliance.api.manual import manual_router
from appliance.api.metrics import MetricsController
from appliance.api.models import JobsController, ModelsController
from appliance.api.ollama import OllamaAdminController, OllamaController
from appliance.api.openai import OpenAIController
from appliance.api.planning import PlanningController
from appliance.api.request import ApplianceRequest
from appliance.api.requests import RequestsController
from appliance.api.responses import ResponsesController
from appliance.api.settings import SettingsController
from appliance.api.usage import CONTROLLERS as USAGE_CONTROLLERS
from appliance.api.users import UsersController
from appliance.requestlog.entry import RequestEntry
from appliance.services import Services
from appliance.settings import Settings
from appliance.webui import console_handlers

log = logging.getLogger("appliance.app")

OPENAPI_PATH = "/openapi"
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
STREAMING_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"})
ANTHROPIC_PATHS = frozenset({"/v1/messages", "/v1/messages/count_tokens"})
NDJSON_PATHS = frozenset({"/api/chat", "/api/generate", "/api/pull"})  # Ollama's streams: one JSON object a line
_TEXT = Schema(type=OpenAPIType.STRING)
_TEXT_OR_NULL = Schema(type=[OpenAPIType.STRING, OpenAPIType.NULL])
ERROR_SCHEMA = Schema(
    type=OpenAPIType.OBJECT,
    required=["error"],
    description="OpenAI's error envelope, for every error of the API.",
    properties={
        "error": Schema(
            type=OpenAPIType.OBJECT,
            required=["message", "type", "param", "code"],
            properties={"message": _TEXT, "type": _TEXT, "param": _TEXT_OR_NULL, "code": _TEXT_OR_NULL},
        )
    },
)
ANTHROPIC_ERROR_SCHEMA = Schema(
    type=OpenAPIType.OBJECT,
    required=["type", "error"],
    description="Anthropic's error shape, for every error of the Messages API.",
    properties={
        "type": _TEXT,
        "error": Schema(type=OpenAPIType.OBJECT, required=["type", "message"], properties={"type": _TEXT, "message": _TEXT}),
    },
)
OLLAMA_ERROR_SCHEMA = Schema(
    type=OpenAPIType.OBJECT,
    required=["error"],
    properties={"error": _TEXT},
    description="Ollama's error body, for every error of the Ollama API (/api/*).",
)


def _route_handlers() -> list[ControllerRouterHandler]:
    return [
        healthz,
        readyz,
        OpenAIController,
        ResponsesController,
        AnthropicController,
        FilesController,
        BatchesController,
        InstancesController,
        KeysController,
        AliasesController,
        OpsController,
        ModelsController,
        JobsController,
        PlanningController,
        AuditController,
        *USAGE_CONTROLLERS,
        RequestsController,
        MetricsController,
        CacheController,
        UsersController,
        OllamaController,
        OllamaAdminController,
        *console_handlers(),
        SettingsController,
        manual_router(),
    ]


def create_app(settings: Settings, services: Services | None = None) -> Litestar:
    """Build the app. ``services`` is created and started in the lifespan unless given."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        own = services is None
        svc = services or Services(settings)
        if own:
            await svc.start()
        app.state.services = svc  # read by the providers of appliance.api.dependencies only
        try:
            yield
        finally:
            if own:
                await svc.stop()

    app = Litestar(
        route_handlers=_route_handlers(),
        guards=[AccessGuard(lambda: app.state.services.keyring, metrics_public=lambda: settings.metrics_public)],
        dependencies=dependencies(),
        lifespan=[lifespan],
        exception_handlers=EXCEPTION_HANDLERS,  # type: ignore[arg-type]
        openapi_config=OpenAPIConfig(
            title="LLM appliance",
            version=__version__,
            # The document only: a viewer page would load scripts from a CDN.
            render_plugins=[JsonRenderPlugin()],
            openapi_router=Router(path=OPENAPI_PATH, route_handlers=[], opt=requires(Access.KEY), include_in_schema=False),
            components=Components(security_schemes={"apiKey": SecurityScheme(type="http", scheme="bearer")}),
            security=[{"apiKey": []}],
        ),
        request_class=ApplianceRequest,
        request_max_body_size=16 * 1024 * 1024,
        logging_config=None,
        debug=False,
    )
    _document_errors(app)
    return app


def _document_errors(app: Litestar) -> None:
    """Make the OpenAPI document say what the API does on errors.

    Litestar documents its own validation-error shape for 400 and no other error,
    while every error here is OpenAI's envelope (one handler: appliance.api.errors),
    Anthropic's shape on the Messages API, or Ollama's ``{"error": "..."}`` under
    /api, with any status from 400 to 503; the health probes need no key.
    """
    document = app.openapi_schema
    if document.components is not None:
        document.components.schemas = {
            **(document.components.schemas or {}),
            "Error": ERROR_SCHEMA,
            "AnthropicError": ANTHROPIC_ERROR_SCHEMA,
            "OllamaError": OLLAMA_ERROR_SCHEMA,
        }
    openai_error = OpenAPIResponse(
        description="Error (OpenAI's envelope)",
        content={"application/json": OpenAPIMediaType(schema=Reference(ref="#/components/schemas/Error"))},
    )
    anthropic_error = OpenAPIResponse(
        description="Error (Anthropic's shape)",
        content={"application/json": OpenAPIMediaType(schema=Reference(ref="#/components/schemas/AnthropicError"))},
    )
    ollama_error = OpenAPIResponse(
        description="Error (Ollama's shape)",
        content={"application/json": OpenAPIMediaType(schema=Reference(ref="#/components/schemas/OllamaError"))},
    )
    for path, item in (document.paths or {}).items():
        for method in ("get", "put", "post", "delete", "patch"):
            operation = getattr(item, method, None)
            if operation is None:
                continue
            responses = dict(operation.responses or {})
            if path in OPEN_PATHS:
                operation.security = []
                if path == "/readyz" and "200" in responses:
                    responses["503"] = responses["200"]  # not ready: the same report, with status 503
            else:
                error = anthropic_error if path in ANTHROPIC_PATHS else ollama_error if path.startswith("/api/") else openai_error
                responses["400"] = error
                responses["default"] = error
            if path in STREAMING_PATHS and "200" in responses:
                ok = responses["200"]
                content = dict(getattr(ok, "content", None) or {})
                # with `stream: true`: server-sent events, each a JSON chunk, ending with `data: [DONE]`
                content["text/event-stream"] = OpenAPIMediaType()
                ok.content = content
            if path in NDJSON_PATHS and "200" in responses:
                ok = responses["200"]
                # unless `stream` is false: newline-delimited JSON objects, the last with `done: true`
                ok.content = {**dict(getattr(ok, "content", None) or {}), "application/x-ndjson": OpenAPIMediaType()}
            if _offers_csv(operation) and "200" in responses:
                ok = responses["200"]
                # with `format=csv`: the same rows as a CSV download
                ok.content = {
                    **dict(getattr(ok, "content", None) or {}),
                    "text/csv": OpenAPIMediaType(schema=Schema(type=OpenAPIType.STRING)),
                }
            operation.responses = responses


def _offers_csv(operation: object) -> bool:
    """Whether an operation takes ``format=csv`` (the admin list exports): its 200 is then JSON or CSV."""
    for parameter in getattr(operation, "parameters", None) or []:
        schema = getattr(parameter, "schema", None)
        if getattr(parameter, "name", None) == "format" and "csv" in str(getattr(schema, "pattern", "") or ""):
            return True
    return False


def wrap(app: Litestar, settings: Settings, *, local: bool = False) -> ApplianceASGI:
    """The served ASGI app: the HTTP edge (Host, canonical path) in front of Litestar."""

    def observe_overhead(endpoint: str, seconds: float) -> None:
        services = getattr(app.state, "services", None)  # started by the lifespan; absent before it
        if services is not None:
            services.metrics.observe_overhead(endpoint, seconds)

    def record_request(entry: RequestEntry) -> None:
        services = getattr(app.state, "services", None)
        if services is not None:
            services.request_log.record(entry)

    return ApplianceASGI(
        app, settings.allowed_hosts, local=local, observe_overhead=observe_overhead, record_request=record_request
    )
