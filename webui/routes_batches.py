"""Batches: every key's batches with their progress, one batch's detail, cancelling (operators and admins) and its
error file (admins).

The pages read and act through the Batch API's own store and runner (:class:`~appliance.batch.store.BatchStore`,
:class:`~appliance.batch.runner.BatchRunner`), as the API does for an admin key: a cancel here is the cancel of
``POST /v1/batches/{id}/cancel``, and is written to the audit log.
"""

from __future__ import annotations

from litestar import Request, Response, get, post
from sqlalchemy import text
from sqlalchemy.engine import Engine

from appliance.accounts.keys import Principal
from appliance.batch.files import FileStore
from appliance.batch.objects import batch_objects
from appliance.batch.runner import BatchRunner
from appliance.batch.store import BatchStore
from appliance.db.audit import AuditTrail
from appliance.errors import NotFound
from appliance.jsontypes import JsonObject
from appliance.webui.context import ConsoleUser
from appliance.webui.gate import needs
from appliance.webui.render import page, partial

PAGE = 50
CANCELLABLE = ("validating", "in_progress")  # as BatchStore.cancel allows


def console_reader(user: ConsoleUser) -> Principal:
    """The console sees every key's batches, as an admin key does; who may cancel is the route's guard."""
    return Principal(kind="user", id=None, name=user.username, role="admin")


def _key_names(db: Engine, key_ids: set[int]) -> dict[int, str]:
    if not key_ids:
        return {}
    marks = ", ".join(f":k{i}" for i in range(len(key_ids)))
    with db.connect() as conn:
        rows = conn.execute(
            text(f"SELECT id, name, prefix FROM api_keys WHERE id IN ({marks})"), {f"k{i}": k for i, k in enumerate(key_ids)}
        )
        return {int(i): f"{name} ({prefix}…)" for i, name, prefix in rows}


def _with_keys(db: Engine, batches: list[JsonObject], key_ids: list[int | None]) -> list[JsonObject]:
    names = _key_names(db, {k for k in key_ids if k is not None})
    labels = [names.get(k, "deleted key") if k is not None else "local admin" for k in key_ids]
    return [{**b, "key": label} for b, label in zip(batches, labels, strict=True)]


@get("/batches", include_in_schema=False, sync_to_thread=True)
def batches_page(request: Request, db: Engine, batch_store: BatchStore, user: ConsoleUser) -> Response:
    after = request.query_params.get("after") or None
    rows, more = batch_store.list(console_reader(user), after, PAGE)
    batches = _with_keys(db, batch_objects(batch_store, rows), [r.key_id for r in rows])
    return page(request, "batches.html", active="batches", batches=batches, after=rows[-1].id if more and rows else None)


def _detail(db: Engine, batch_store: BatchStore, user: ConsoleUser, batch_id: str) -> JsonObject:
    row = batch_store.get(console_reader(user), batch_id)
    return _with_keys(db, batch_objects(batch_store, [row]), [row.key_id])[0]


@get("/batches/{batch_id:str}", include_in_schema=False, sync_to_thread=True)
def batch_page(request: Request, batch_id: str, db: Engine, batch_store: BatchStore, user: ConsoleUser) -> Response:
    batch = _detail(db, batch_store, user, batch_id)
    cancellable = batch["status"] in CANCELLABLE
    return page(request, "batch.html", active="batches", batch=batch, cancellable=cancellable, message=None)


@post("/batches/{batch_id:str}/cancel", guards=[needs("operator")], include_in_schema=False, sync_to_thread=True)
def cancel_batch(
    request: Request,
    batch_id: str,
    db: Engine,
    batch_store: BatchStore,
    batch_runner: BatchRunner,
    audit: AuditTrail,
    user: ConsoleUser,
) -> Response:
    batch_store.cancel(console_reader(user), batch_id)
    batch_runner.wake()
    audit.record(user.actor, "batch.cancel", batch_id)
    batch = _detail(db, batch_store, user, batch_id)
    message = "Cancelling: lines in flight finish, no more start."
    return partial(request, "_batch.html", batch=batch, cancellable=False, message=message)


@get("/batches/{batch_id:str}/errors", guards=[needs("admin")], include_in_schema=False, sync_to_thread=True)
def batch_errors(batch_id: str, batch_store: BatchStore, files: FileStore, user: ConsoleUser) -> Response:
    """The batch's error file (one JSON line per failed line), for an admin to download."""
    row = batch_store.get(console_reader(user), batch_id)
    if row.error_file_id is None:
        raise NotFound(f"The batch `{batch_id}` has no error file.")
    content = files.content(console_reader(user), row.error_file_id)
    return Response(
        content=content,
        media_type="application/jsonl",
        headers={"Content-Disposition": f'attachment; filename="{row.id}-errors.jsonl"'},
    )


HANDLERS = [batches_page, batch_page, cancel_batch, batch_errors]
