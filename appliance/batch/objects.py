"""The objects the Files and Batch APIs answer with, and the lines of output and error files, in OpenAI's shapes."""

from __future__ import annotations

import json
import secrets

from appliance.batch.store import FINAL, BatchStore, LineResult
from appliance.db.batch_tables import Batch, BatchFile
from appliance.jsontypes import JsonObject


def list_page(data: list[JsonObject], has_more: bool) -> JsonObject:
    """One page of a cursor-paginated list (``after``/``limit``), as OpenAI answers ``GET /v1/files`` and ``/v1/batches``."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


def file_object(row: BatchFile) -> JsonObject:
    return {
        "id": row.id,
        "object": "file",
        "bytes": row.bytes,
        "created_at": int(row.created_at),
        "filename": row.filename,
        "purpose": row.purpose,
        "status": "processed",
        "status_details": None,
    }


def _at(value: float | None) -> int | None:
    return int(value) if value is not None else None


def batch_object(row: Batch, counts: tuple[int, int] | None = None) -> JsonObject:
    completed, failed = counts if counts is not None else (row.completed, row.failed)
    errors = json.loads(row.errors) if row.errors else None
    return {
        "id": row.id,
        "object": "batch",
        "endpoint": row.endpoint,
        "errors": {"object": "list", "data": errors} if errors else None,
        "input_file_id": row.input_file_id,
        "completion_window": row.completion_window,
        "status": row.status,
        "output_file_id": row.output_file_id,
        "error_file_id": row.error_file_id,
        "created_at": int(row.created_at),
        "in_progress_at": _at(row.in_progress_at),
        "expires_at": _at(row.expires_at),
        "finalizing_at": _at(row.finalizing_at),
        "completed_at": _at(row.completed_at),
        "failed_at": _at(row.failed_at),
        "expired_at": _at(row.expired_at),
        "cancelling_at": _at(row.cancelling_at),
        "cancelled_at": _at(row.cancelled_at),
        "request_counts": {"total": row.total, "completed": completed, "failed": failed},
        "metadata": json.loads(row.metadata_json) if row.metadata_json else None,
    }


def batch_objects(store: BatchStore, rows: list[Batch]) -> list[JsonObject]:
    """Batch objects; a batch still running counts its lines from the recorded results."""
    counts = store.counts([r.id for r in rows if r.status not in FINAL])
    return [batch_object(r, counts.get(r.id, (0, 0)) if r.status not in FINAL else None) for r in rows]


def result_line(result: LineResult) -> JsonObject:
    """One line of an output or error file: ``{"id", "custom_id", "response": {"status_code", "request_id", "body"},
    "error"}``; a line that never reached the API (expired, cancelled) has ``response`` null and ``error`` set."""
    if result.status_code == 0:
        return {"id": f"batch_req_{secrets.token_hex(12)}", "custom_id": result.custom_id, "response": None, "error": result.body}
    error = result.body.get("error") if not result.ok else None
    return {
        "id": f"batch_req_{secrets.token_hex(12)}",
        "custom_id": result.custom_id,
        "response": {"status_code": result.status_code, "request_id": result.request_id, "body": result.body},
        "error": {"code": error.get("code"), "message": error.get("message")} if isinstance(error, dict) else None,
    }
