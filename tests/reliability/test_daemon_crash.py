"""kill -9 of the daemon during mixed load, then a restart on the same data dir (reliability-table row 13).

What must hold afterwards:

* the database is intact (``PRAGMA integrity_check`` = ok);
* every request a client saw succeed has its usage row, matched by the
  ``x-request-id`` the gateway sent (a 200 body, or ``[DONE]`` for a stream,
  is only sent after the row is committed);
* the quota counters agree with the ledger and nothing stays reserved, so the
  key is not locked out by reservations of requests that died with the daemon;
* the engines die with their daemon instead of living on as orphans that hold
  the model's memory;
* the restarted daemon serves the same key at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import time

import psutil
import pytest

from tests.reliability.kit import TINY, MixedLoad, chat_body, db_rows, load, restart, start_tiny_daemon, tree_pids, wait_until

pytestmark = pytest.mark.slow


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_kill_9_of_the_daemon_under_mixed_load_loses_no_acknowledged_usage(tmp_path, tiny_gguf):
    daemon = start_tiny_daemon(tmp_path, tiny_gguf)
    engines: list[int] = []
    try:
        key = daemon.create_key("crash")
        prefix = key[:12]
        with daemon.admin() as admin:
            response = admin.put(f"/admin/quotas/key:{prefix}", json={"max_concurrent": 32, "tokens_per_day": 50_000_000})
            assert response.status_code == 200, response.text
        load(daemon)
        engines = tree_pids(daemon.proc.pid)[1:]
        assert engines, "the engine should be a child of the daemon"

        mixed = MixedLoad(daemon.url, key, ["chat", "stream", "completion", "embedding"], threads=4).start()
        wait_until(lambda: mixed.acknowledged() >= 40, 90, 0.1, "40 acknowledged requests")
        time.sleep(0.3)  # requests in every phase (admit, generate, settle) at the moment of the kill
        os.kill(daemon.proc.pid, signal.SIGKILL)  # the daemon alone, as the OOM killer would
        daemon.proc.wait(10)
        outcomes = mixed.stop()

        # The engines notice that their daemon is gone and exit (no orphan keeps the model's memory).
        wait_until(lambda: not any(_alive(p) for p in engines), 15, 0.1, "engines exiting after their daemon died")

        acknowledged = {o.request_id for o in outcomes if o.acknowledged}
        assert len(acknowledged) >= 40 and None not in acknowledged
        by_op = {o.op for o in outcomes if o.acknowledged}
        assert by_op == {"chat", "stream", "completion", "embedding"}
        assert any(not o.acknowledged for o in outcomes), "the kill should have cut some requests short"

        daemon = restart(daemon)
        conn = sqlite3.connect(daemon.data_dir / "appliance.db", timeout=30)
        try:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        finally:
            conn.close()
        recorded = {r[0] for r in db_rows(daemon.data_dir, "SELECT request_id FROM usage")}
        missing = acknowledged - recorded
        assert not missing, f"{len(missing)} acknowledged requests have no usage row: {sorted(missing)[:5]}"
        assert len(recorded) >= len(acknowledged)

        # Counters agree with the ledger; the reservations of the killed requests are released.
        with daemon.admin() as admin:
            usage = admin.get(f"/admin/quotas/key:{prefix}").json()["usage"]
        ((tokens,),) = db_rows(
            daemon.data_dir,
            "SELECT coalesce(sum(prompt_tokens + completion_tokens), 0) FROM usage u "
            "JOIN api_keys k ON k.id = u.key_id WHERE k.prefix = ?",
            prefix,
        )
        assert usage["tokens_per_day"]["reserved"] == 0 and usage["max_concurrent"]["reserved"] == 0
        assert usage["tokens_per_day"]["spent"] == pytest.approx(tokens)

        with daemon.client(key) as client:
            response = client.post("/v1/chat/completions", json=chat_body("after the crash"))
            assert response.status_code == 200, response.text
            assert response.json()["model"] == TINY
    finally:
        daemon.kill()
        for pid in engines:  # in case the check above failed: leave no orphan behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
