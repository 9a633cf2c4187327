"""The composition root: the daemon's collaborators, built once and handed to every route.

Construction order is the dependency order: database, keys, audit trail,
jobs, store, names, meter, quotas, load events, router, cache, gateway,
stored responses and the responses service. ``start()`` seeds the
default model, starts the meter's writer and the scheduler; ``stop()`` undoes
it in reverse, draining engines and flushing the ledger last. Handlers never
reach in here: Litestar's dependency injection hands each one the typed
collaborators it names (``appliance.api.dependencies``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from datetime import UTC, datetime
from pathlib import Path

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from appliance.accounts.keys import KeyRing
from appliance.accounts.rotation import KeyLifecycle
from appliance.batch.capacity import Capacity
from appliance.batch.deferred import LineMeter
from appliance.batch.files import FileStore
from appliance.batch.runner import BatchRunner
from appliance.batch.store import BatchStore
from appliance.cache.embedder import make_embedder
from appliance.cache.responses import ResponseCache
from appliance.db.audit import AuditTrail
from appliance.db.engine import make_engine
from appliance.drivers import get_driver
from appliance.hardware.energy import EnergyMeter
from appliance.metering.admin import QuotaService
from appliance.metering.alerts import AlertNotifier
from appliance.metering.box_figures import MIN_REFRESH_S, BoxFigures, register_figure_gauges
from appliance.metering.key_expiry import CHECK_EVERY_SECONDS as KEY_EXPIRY_CHECK_SECONDS
from appliance.metering.key_expiry import KeyExpiryAlerts
from appliance.metering.meter import Meter
from appliance.monitoring.gauges import register_box_gauges
from appliance.planner.service import hub_chooser
from appliance.planner.types import Plan
from appliance.requestlog.writer import RequestLog
from appliance.serving.engines import EngineProcess
from appliance.serving.gateway import Gateway
from appliance.serving.load_events import LoadEvents
from appliance.serving.load_plan import LoadPlanner
from appliance.serving.names import ModelNames
from appliance.serving.prompt_tokens import PromptCounts
from appliance.serving.responses.service import ResponsesService
from appliance.serving.responses.stored import ResponseStore
from appliance.serving.router import EngineLike, Instance, Router
from appliance.settings import Settings
from appliance.settings.config_file import config_file_path
from appliance.settings.runtime import RuntimeSettings, under_systemd
from appliance.store.jobs import JobRegistry
from appliance.store.store import ModelStore, ResolvedVariant

log = logging.getLogger("appliance.services")

ALERT_POLL_SECONDS = 5  # how soon a raised budget alert reaches the webhook


def _engine_gpu_bytes(engine: EngineLike, plan: Plan) -> int | None:
    """GPU memory NVML charges to a loaded engine's processes (None for a CPU-only plan or without NVML)."""
    if not engine.pid or not plan.n_gpu_layers:
        return None
    from appliance.planner.calibration import gpu_bytes_of, process_tree_pids

    try:
        return gpu_bytes_of(process_tree_pids(engine.pid))
    except Exception:  # the engine exited meanwhile: nothing to measure
        return None


class Services:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.db = make_engine(settings.db_path)
        self.keyring = KeyRing(self.db)
        self.key_expiry = KeyExpiryAlerts(self.db)
        self.key_lifecycle = KeyLifecycle(self.keyring, self.db, after_expiry_change=self.key_expiry.raise_due)
        self.audit = AuditTrail(self.db)
        self.jobs = JobRegistry(self.db)
        self.store = ModelStore(settings, self.db, is_loaded=self.is_loaded, choose=hub_chooser(settings, self.db))
        self.names = ModelNames(settings, self.db, self.store)
        self.meter = Meter(settings, self.db)
        self.metrics = self.meter.metrics
        self.quotas = QuotaService(self.db, self.meter, families=self.store.family_names)
        self.alerts = AlertNotifier(settings, self.db)
        self.energy = EnergyMeter()
        self.load_planner = LoadPlanner(settings, self.db)
        self.load_events = LoadEvents()
        self.runtime_settings = RuntimeSettings(
            settings, self.audit, config_file_path(), after_live_change=self._settings_changed, supervised=under_systemd()
        )
        self.router = Router(
            settings,
            make_plan=self._plan,
            make_engine_process=self._engine,
            on_loaded=self._after_load,
            on_stopping=self._before_stop,
            events=self.load_events,
            gpu_bytes=_engine_gpu_bytes,
        )
        self.cache = ResponseCache(settings, self.db, make_embedder(settings))
        self.prompt_counts = PromptCounts()
        self.gateway = Gateway(
            settings,
            self.names,
            self.router,
            self.meter,
            cache=self.cache,
            metrics=self.metrics,
            energy=self.energy,
            prompts=self.prompt_counts,
        )
        self.response_store = ResponseStore(settings, self.db)
        self.responses = ResponsesService(self.gateway, self.response_store)
        self.files = FileStore(settings, self.db)
        self.batch_store = BatchStore(self.db)
        # the same gateway, whose settles a batch line holds until it is recorded
        batch_gateway = self.gateway.metered_by(LineMeter(self.meter))  # type: ignore[arg-type]
        self.figures = BoxFigures(settings, self.db, self._decode_capacity)
        capacity = Capacity(settings, self.router, self.names, self.figures.interactive_attainment)
        self.batch_runner = BatchRunner(settings, self.batch_store, self.files, batch_gateway, capacity, self.keyring)
        self.request_log = RequestLog(settings.db_path, days=settings.request_log_days, max_rows=settings.request_log_max_rows)
        self.scheduler: AsyncIOScheduler | None = None
        self._register_gauges()

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self.settings.store_read_only:
            self.jobs.submit("scan", None, lambda ctx: {"registered": [i.name for i in self.store.register_found(ctx=ctx)]})
        elif self.settings.seed_default_model:
            from appliance.store.default_model import seed_default_model

            seed_default_model(self.settings, self.store)
        await self.meter.start()
        self.request_log.start()
        await self.batch_runner.start()
        self._start_scheduler()

    async def stop(self) -> None:
        if self.scheduler is not None:
            self.scheduler.shutdown(wait=False)
        await self.batch_runner.stop()
        await self.router.stop_all()
        self.prompt_counts.close()
        await asyncio.to_thread(self.request_log.stop)
        await self.meter.stop()
        self.cache.close()
        await asyncio.to_thread(self.jobs.shutdown)
        self.db.dispose()

    def _register_gauges(self) -> None:
        router = self.router
        self.metrics.set_gauge_source("loaded_instances", lambda: len(router.instances))
        self.metrics.set_gauge_source("queue_depth", lambda: {n: i.queue.waiting for n, i in router.instances.items()})
        self.metrics.set_gauge_source("kv_slots_in_use", lambda: {n: i.queue.active for n, i in router.instances.items()})
        self.metrics.set_gauge_source("kv_slots_total", lambda: {n: i.queue.slots for n, i in router.instances.items()})
        register_box_gauges(self.metrics, self.settings.data_dir, self.db)
        register_figure_gauges(self.metrics, self.figures)

    def _decode_capacity(self) -> dict[str, float]:
        """The planner's aggregate decode tokens/s of each loaded model (the box's capacity at the current mix)."""
        return {n: i.plan.aggregate_tps for n, i in self.router.instances.items() if i.plan.aggregate_tps}

    def _start_scheduler(self) -> None:
        from appliance.hardware.telemetry import sample_telemetry
        from appliance.metering.rollups import rollup

        scheduler = AsyncIOScheduler(timezone="UTC")
        scheduler.add_job(rollup, "interval", minutes=5, args=[self.db], id="usage-rollup", coalesce=True, max_instances=1)
        scheduler.add_job(self.meter.prune_counters, "interval", hours=1, id="prune-counters", coalesce=True, max_instances=1)
        scheduler.add_job(
            sample_telemetry, "interval", seconds=5, args=[self.metrics], id="telemetry", coalesce=True, max_instances=1
        )
        scheduler.add_job(
            self.figures.refresh, "interval", seconds=MIN_REFRESH_S, id="ledger-figures", coalesce=True, max_instances=1
        )
        if self.settings.idle_unload_seconds:
            scheduler.add_job(
                self._unload_idle,
                "interval",
                seconds=max(5, min(60, self.settings.idle_unload_seconds // 4)),
                id="idle-unload",
                coalesce=True,
                max_instances=1,
            )
        scheduler.add_job(
            self.response_store.purge_expired,
            "interval",
            minutes=10,
            id="stored-responses-expiry",
            coalesce=True,
            max_instances=1,
        )
        scheduler.add_job(
            self.meter.release_stale, "interval", seconds=60, id="stale-reservations", coalesce=True, max_instances=1
        )
        scheduler.add_job(
            self._prune_request_log,
            "interval",
            minutes=1,
            next_run_time=datetime.now(UTC),
            id="request-log-prune",
            coalesce=True,
            max_instances=1,
        )
        scheduler.add_job(
            self.key_expiry.check,
            "interval",
            seconds=KEY_EXPIRY_CHECK_SECONDS,
            next_run_time=datetime.now(UTC),
            id="key-expiry-alerts",
            coalesce=True,
            max_instances=1,
        )
        scheduler.add_job(self._backup, "cron", hour=3, minute=17, id="daily-backup", coalesce=True, max_instances=1)
        # Scheduled whether or not a webhook is set now: the webhook can be set at runtime (deliver_due does nothing without it).
        scheduler.add_job(
            self.alerts.deliver_due,
            "interval",
            seconds=ALERT_POLL_SECONDS,
            id="budget-alerts",
            coalesce=True,
            max_instances=1,
        )
        scheduler.start()
        self.scheduler = scheduler

    async def _prune_request_log(self) -> None:
        await asyncio.to_thread(self.request_log.prune)

    async def _backup(self) -> None:
        from appliance.db.backup import scheduled_backup

        path = await asyncio.to_thread(scheduled_backup, self.settings.db_path, self.settings.data_dir / "backups")
        log.info("daily backup written", extra={"fields": {"path": str(path)}})

    async def _unload_idle(self) -> None:
        for name in await self.router.unload_idle(self.settings.idle_unload_seconds):
            self.audit.record("scheduler", "model.unload_idle", name)

    def _settings_changed(self, names: set[str]) -> None:
        """After live settings changed: forget what was derived from the old values."""
        if "default_model" in names:
            self.names.forget()  # the `default` alias follows default_model
        if "log_level" in names:
            logging.getLogger().setLevel(self.settings.log_level.upper())
        if names & {"request_log_days", "request_log_max_rows"}:  # the request log is pruned to its new bounds at once
            self.request_log.days, self.request_log.max_rows = self.settings.request_log_days, self.settings.request_log_max_rows
            self.request_log.prune()

    # ------------------------------------------------------------ loading
    def is_loaded(self, name: str) -> bool:
        return self.router.is_loaded(name)  # asked on deletes, after construction

    def _plan(self, target: ResolvedVariant) -> Plan:
        return self.load_planner.plan(self.names.verified(target))

    def _engine(self, name: str, plan: Plan) -> EngineProcess:
        driver = get_driver(plan.backend)
        socket_path = self.settings.run_dir / f"engine-{secrets.token_hex(4)}.sock"
        return EngineProcess(name, plan, driver, self.settings, socket_path)

    async def _after_load(self, instance: Instance) -> None:
        self.audit.record("system", "model.load", instance.name, f"backend={instance.backend}")
        from appliance.planner.calibration import gpu_bytes_of, process_tree_pids, record_load

        pid = instance.engine.pid
        gpu = gpu_bytes_of(process_tree_pids(pid)) if pid and instance.plan.n_gpu_layers else None
        record_load(self.db, instance.plan, instance.engine.rss_bytes(), gpu)
        await self.prompt_counts.warm(Path(instance.plan.model_path))

    async def _before_stop(self, instance: Instance) -> None:
        """Keep how fast the engine really decoded (llama.cpp engines count their decode-only steps)."""
        if instance.plan.backend != "llamacpp" or instance.engine.state != "ready":
            return
        from appliance.planner.calibration import decode_speed_from_stats, record_decode_speed

        async with asyncio.timeout(2.0):
            status, body = await instance.engine.client.get("/stats")
        speed = decode_speed_from_stats(json.loads(body)) if status == 200 else None
        if speed is not None:
            await asyncio.to_thread(record_decode_speed, self.db, instance.plan, speed)

    def after_restore(self) -> None:
        """Forget every in-memory copy of database state after a restore."""
        self.keyring.forget_all()
        self.names.forget()
        self.meter.invalidate_quotas()
        self.cache.clear_memory()
