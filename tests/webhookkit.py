"""A real webhook receiver on loopback for the alert tests, and an address where nothing listens."""

from __future__ import annotations

import hashlib
import hmac
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """A real HTTP server on loopback that records what it is sent and answers ``status``."""

    def __init__(self, status: int = 204):
        self.status = status
        self.received: list[tuple[dict[str, str], bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(outer.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/budget"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def signature_ok(self, headers: dict[str, str], body: bytes, secret: str) -> bool:
        expected = hmac.new(secret.encode(), headers["x-appliance-timestamp"].encode() + b"." + body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(headers["x-appliance-signature"], f"sha256={expected}")


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/down"
