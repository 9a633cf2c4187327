"""The daemon's collaborators, built once in the lifespan and shared by every route.

Construction order is the dependency order: database, keys, store, meter,
router, gateway, scheduler. ``stop()`` undoes it in reverse, draining engines
and flushing the ledger last.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import Any

from sqlalchemy import select

from appliance.db import engine as dbmod
from appliance.accounts.keys import KeyRing
from appliance.drivers import get_driver
from appliance.hardware.energy import EnergyMeter
from appliance.serving.engines import EngineProcess
from appliance.errors import ModelNotFound
from appliance.serving.router import Instance, Router
from appliance.settings import Settings
from appliance.db.tables import Alias, AuditLog

log = logging.getLogger("appliance.services")

BUILTIN_ALIASES = ("default",)


class Services:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.started_at = time.time()
        self.db = dbmod.make_engine(settings.db_path)
        self.keyring = KeyRing(self.db)
        self.store: Any = None
        self.jobs: Any = None
        self.meter: Any = None
        self.metrics: Any = None
        self.cache: Any = None
        self.router: Router | None = None
        self.gateway: Any = None
        self.scheduler: Any = None
        self.hardware: Any = None
        self.energy: Any = None
        self._aliases: dict[str, str] | None = None
        self._names: dict[str, str] = {}

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        from appliance.cache.responses import ResponseCache
        from appliance.cache.embedder import make_embedder
        from appliance.serving.gateway import Gateway
        from appliance.store.jobs import JobRegistry
        from appliance.metering.meter import Meter
        from appliance.store.store import ModelStore

        self.jobs = JobRegistry(self.db)
        self.store = ModelStore(self.settings, self.db, is_loaded=self.is_loaded)
        if self.settings.seed_default_model:
            from appliance.store.default_model import seed_default_model

            seed_default_model(self.settings, self.store)
        self.meter = Meter(self.settings, self.db)
        await self.meter.start()
        self.metrics = self.meter.metrics
        self.energy = EnergyMeter()
        self.router = Router(self.settings, canonical_name=self.canonical_name, make_plan=self.make_plan,
                             make_engine=self.make_engine, on_loaded=self._after_load)
        self._register_gauges()
        self.cache = ResponseCache(self.settings, self.db, make_embedder(self.settings))
        self.gateway = Gateway(self.settings, self.router, self.meter, cache=self.cache, metrics=self.metrics, energy=self.energy)
        self._start_scheduler()

    async def stop(self) -> None:
        if self.scheduler is not None:
            self.scheduler.shutdown(wait=False)
        if self.router is not None:
            await self.router.stop_all()
        if self.meter is not None:
            await self.meter.stop()
        if self.cache is not None:
            self.cache.close()
        if self.jobs is not None:
            await asyncio.to_thread(self.jobs.shutdown)
        self.db.dispose()

    def _register_gauges(self) -> None:
        router = self.router
        assert router is not None
        self.metrics.set_gauge_source("loaded_instances", lambda: len(router.instances))
        self.metrics.set_gauge_source("queue_depth", lambda: {n: i.queue.waiting for n, i in router.instances.items()})
        self.metrics.set_gauge_source("kv_slots_in_use", lambda: {n: i.queue.active for n, i in router.instances.items()})
        self.metrics.set_gauge_source("kv_slots_total", lambda: {n: i.queue.slots for n, i in router.instances.items()})

    def _start_scheduler(self) -> None:
        from apscheduler.schedulers.asyncio import AsyncIOScheduler

        from appliance.metering.rollups import rollup
        from appliance.hardware.telemetry import sample_telemetry

        scheduler = AsyncIOScheduler(timezone="UTC")
        scheduler.add_job(rollup, "interval", minutes=5, args=[self.db], id="usage-rollup", coalesce=True, max_instances=1)
        scheduler.add_job(self.meter.prune_counters, "interval", hours=1, id="prune-counters", coalesce=True, max_instances=1)
        scheduler.add_job(sample_telemetry, "interval", seconds=5, args=[self.metrics], id="telemetry", coalesce=True, max_instances=1)
        if self.settings.idle_unload_seconds:
            scheduler.add_job(self._unload_idle, "interval", seconds=max(5, min(60, self.settings.idle_unload_seconds // 4)),
                              id="idle-unload", coalesce=True, max_instances=1)
        scheduler.add_job(self.meter.release_stale, "interval", seconds=60, id="stale-reservations", coalesce=True, max_instances=1)
        scheduler.add_job(self._backup, "cron", hour=3, minute=17, id="daily-backup", coalesce=True, max_instances=1)
        scheduler.start()
        self.scheduler = scheduler

    async def _backup(self) -> None:
        from appliance.db.backup import scheduled_backup

        path = await asyncio.to_thread(scheduled_backup, self.settings.db_path, self.settings.data_dir / "backups")
        log.info("daily backup written", extra={"fields": {"path": str(path)}})

    async def _unload_idle(self) -> None:
        assert self.router is not None
        for name in await self.router.unload_idle(self.settings.idle_unload_seconds):
            self.audit("scheduler", "model.unload_idle", name)

    # ------------------------------------------------------------ routing
    def is_loaded(self, name: str) -> bool:
        return self.router is not None and self.router.is_loaded(name)

    def aliases(self) -> dict[str, str]:
        if self._aliases is None:
            with dbmod.session(self.db) as s:
                rows = s.execute(select(Alias)).scalars().all()
            self._aliases = {"default": self.settings.default_model, **{r.name: r.target for r in rows}}
        return self._aliases

    def names_changed(self) -> None:
        """Forget cached name resolutions (after alias or store changes)."""
        self._aliases = None
        self._names.clear()

    def canonical_name(self, requested: str) -> str:
        cached = self._names.get(requested)
        if cached is not None:
            return cached
        target = self.aliases().get(requested, requested)
        try:
            name = self.store.resolve(target).name
        except ModelNotFound:
            raise ModelNotFound(f"The model `{requested}` does not exist.", param="model") from None
        if len(self._names) > 10_000:
            self._names.clear()
        self._names[requested] = name
        return name

    def model_names(self) -> list[dict[str, Any]]:
        entries = []
        for variant in self.store.list():
            if variant.status != "ready":
                continue
            entries.append({"id": variant.name, "created": variant.created_at})
        for alias, target in self.aliases().items():
            entries.append({"id": alias, "created": self.started_at, "target": target})
        return entries

    def make_plan(self, name: str) -> Any:
        from appliance.serving.load_plan import plan_for_load

        return plan_for_load(self, name)

    def make_engine(self, name: str, plan: Any) -> EngineProcess:
        driver = get_driver(plan.backend)
        socket_path = self.settings.run_dir / f"engine-{secrets.token_hex(4)}.sock"
        return EngineProcess(name, plan, driver, self.settings, socket_path)

    async def _after_load(self, instance: Instance) -> None:
        self.audit("system", "model.load", instance.name, f"backend={instance.backend}")
        from appliance.planner.calibration import gpu_bytes_of, process_tree_pids, record_load

        pid = getattr(instance.engine, "pid", None)
        gpu = gpu_bytes_of(process_tree_pids(pid)) if pid and instance.plan.n_gpu_layers else None
        record_load(self.db, instance.plan, instance.engine.rss_bytes(), gpu)

    def after_restore(self) -> None:
        """Forget every in-memory copy of database state after a restore."""
        self.keyring.forget_all()
        self.names_changed()
        if self.meter is not None:
            self.meter.invalidate_quotas()
        if self.cache is not None:
            self.cache.clear_memory()

    # ------------------------------------------------------------ audit
    def audit(self, actor: str, action: str, target: str | None = None, detail: str | None = None) -> None:
        with dbmod.session(self.db) as s:
            s.add(AuditLog(actor=actor, action=action, target=target, detail=detail))
            s.commit()
