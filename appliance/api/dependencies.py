"""The collaborators handlers receive, by parameter name, through Litestar's dependency injection.

A handler that needs the store declares ``store: ModelStore``; the app (and
every in-process test app) registers :func:`dependencies`, whose providers read
the one :class:`~appliance.services.Services` built by the composition root.
The caller comes the same way: ``principal`` (set by the access guard) and
``actor``, the audit log's name for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from litestar import Request
from litestar.datastructures import State
from litestar.di import Provide
from sqlalchemy.engine import Engine

from appliance.accounts.keys import KeyRing, Principal
from appliance.accounts.rotation import KeyLifecycle
from appliance.api.access import audit_actor, principal_of
from appliance.batch.files import FileStore
from appliance.batch.runner import BatchRunner
from appliance.batch.store import BatchStore
from appliance.cache.responses import ResponseCache
from appliance.db.audit import AuditTrail
from appliance.metering.admin import QuotaService
from appliance.metering.box_figures import BoxFigures
from appliance.metering.meter import Meter
from appliance.metrics import Metrics
from appliance.requestlog.writer import RequestLog
from appliance.serving.gateway import Gateway
from appliance.serving.load_events import LoadEvents
from appliance.serving.names import ModelNames
from appliance.serving.responses.service import ResponsesService
from appliance.serving.responses.stored import ResponseStore
from appliance.serving.router import Router
from appliance.settings import Settings
from appliance.settings.runtime import RuntimeSettings
from appliance.store.jobs import JobRegistry
from appliance.store.store import ModelStore

if TYPE_CHECKING:
    from appliance.services import Services


def _services(state: State) -> Services:
    return state.services


def provide_settings(state: State) -> Settings:
    return _services(state).settings


def provide_db(state: State) -> Engine:
    return _services(state).db


def provide_runtime_settings(state: State) -> RuntimeSettings:
    return _services(state).runtime_settings


def provide_keyring(state: State) -> KeyRing:
    return _services(state).keyring


def provide_key_lifecycle(state: State) -> KeyLifecycle:
    return _services(state).key_lifecycle


def provide_audit(state: State) -> AuditTrail:
    return _services(state).audit


def provide_jobs(state: State) -> JobRegistry:
    return _services(state).jobs


def provide_store(state: State) -> ModelStore:
    return _services(state).store


def provide_names(state: State) -> ModelNames:
    return _services(state).names


def provide_meter(state: State) -> Meter:
    return _services(state).meter


def provide_quotas(state: State) -> QuotaService:
    return _services(state).quotas


def provide_metrics(state: State) -> Metrics:
    return _services(state).metrics


def provide_cache(state: State) -> ResponseCache:
    return _services(state).cache


def provide_router(state: State) -> Router:
    return _services(state).router


def provide_load_events(state: State) -> LoadEvents:
    return _services(state).load_events


def provide_gateway(state: State) -> Gateway:
    return _services(state).gateway


def provide_responses(state: State) -> ResponsesService:
    return _services(state).responses


def provide_response_store(state: State) -> ResponseStore:
    return _services(state).response_store


def provide_files(state: State) -> FileStore:
    return _services(state).files


def provide_batch_store(state: State) -> BatchStore:
    return _services(state).batch_store


def provide_batch_runner(state: State) -> BatchRunner:
    return _services(state).batch_runner


def provide_figures(state: State) -> BoxFigures:
    return _services(state).figures


def provide_after_restore(state: State) -> Callable[[], None]:
    return _services(state).after_restore


def provide_request_log(state: State) -> RequestLog:
    return _services(state).request_log


def provide_principal(request: Request) -> Principal:
    return principal_of(request)


def provide_actor(request: Request) -> str:
    return audit_actor(request)


def dependencies() -> dict[str, Provide]:
    """Every injectable collaborator, by the parameter name handlers use for it."""
    providers: dict[str, Callable[..., object]] = {
        "settings": provide_settings,
        "db": provide_db,
        "keyring": provide_keyring,
        "lifecycle": provide_key_lifecycle,
        "audit": provide_audit,
        "jobs": provide_jobs,
        "store": provide_store,
        "names": provide_names,
        "meter": provide_meter,
        "quotas": provide_quotas,
        "metrics": provide_metrics,
        "cache": provide_cache,
        "runtime_settings": provide_runtime_settings,
        "router": provide_router,
        "gateway": provide_gateway,
        "load_events": provide_load_events,
        "responses": provide_responses,
        "response_store": provide_response_store,
        "files": provide_files,
        "batch_store": provide_batch_store,
        "batch_runner": provide_batch_runner,
        "request_log": provide_request_log,
        "after_restore": provide_after_restore,
        "figures": provide_figures,
        "principal": provide_principal,
        "actor": provide_actor,
    }
    return {name: Provide(provider, sync_to_thread=False) for name, provider in providers.items()}
