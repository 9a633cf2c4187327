"""The end of a batch: its output and error files from the recorded results, and its final status.

Idempotent: after a crash while finalizing, running it again writes the same files (same ids) over the first try.
"""

from __future__ import annotations

import json
import time

from appliance.batch.files import FileStore
from appliance.batch.objects import result_line
from appliance.batch.store import BatchStore
from appliance.db.batch_tables import Batch

STAMP = {"completed": "completed_at", "expired": "expired_at", "cancelled": "cancelled_at", "failed": "failed_at"}


def _jsonl(lines: list[dict]) -> bytes:
    return b"".join(json.dumps(line, ensure_ascii=False).encode() + b"\n" for line in lines)


def finalize(store: BatchStore, files: FileStore, batch: Batch, status: str) -> Batch:
    """Write ``batch``'s output and error files and move it to ``status`` (completed, expired or cancelled)."""
    results = store.results(batch.id)
    ok = [result_line(r) for r in results if r.ok]
    failed = [result_line(r) for r in results if not r.ok]
    suffix = batch.id.removeprefix("batch_")
    output = files.keep_output(f"file-{suffix}out", batch.key_id, f"{batch.id}_output.jsonl", _jsonl(ok), len(ok)) if ok else None
    errors = (
        files.keep_output(f"file-{suffix}err", batch.key_id, f"{batch.id}_error.jsonl", _jsonl(failed), len(failed))
        if failed
        else None
    )
    return store.set_status(
        batch.id,
        status,
        output_file_id=output.id if output else None,
        error_file_id=errors.id if errors else None,
        completed=len(ok),
        failed=len(failed),
        **{STAMP[status]: time.time()},
    )
