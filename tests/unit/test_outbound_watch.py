"""The outbound watch that the offline tests rely on sees what it must, and nothing local."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

WATCH = Path(__file__).resolve().parents[1] / "outbound_watch"

# Audit events raised by hand: the hook sees them exactly as it sees real sockets, and nothing leaves the box.
EVENTS = """
import sys
sys.audit("socket.connect", None, ("192.0.2.7", 443))
sys.audit("socket.connect", None, ("127.0.0.1", 8080))
sys.audit("socket.connect", None, ("::1", 8080, 0, 0))
sys.audit("socket.connect", None, "/data/run/engine.sock")
sys.audit("socket.getaddrinfo", "huggingface.co", 443, 0, 0, 0)
sys.audit("socket.getaddrinfo", "localhost", 8080, 0, 0, 0)
sys.audit("socket.sendto", None, ("198.51.100.1", 53))
"""


def test_the_watch_logs_every_attempt_to_reach_another_host_and_only_those(tmp_path):
    log = tmp_path / "outbound.jsonl"
    env = {**os.environ, "PYTHONPATH": str(WATCH), "APPLIANCE_TEST_OUTBOUND_LOG": str(log)}
    subprocess.run([sys.executable, "-c", EVENTS], env=env, check=True, timeout=60)
    hosts = [json.loads(line)["host"] for line in log.read_text().splitlines()]
    assert hosts == ["192.0.2.7", "huggingface.co", "198.51.100.1"]
