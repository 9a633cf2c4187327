"""Structured logging with secret redaction.

Every record passes through :class:`RedactingFilter`, so an API key, a bearer
token or a password that reaches a log call by mistake is masked before it is
written. Redaction is done here, once, not by remembering at each call site.
"""

from __future__ import annotations

import io
import json
import logging
import logging.handlers
import re
import sys
import time
from pathlib import Path

from appliance.db.private_files import open_private, private_dir, private_file

# API keys (ak_...), bearer tokens, key=value secrets (JSON, Python repr, query strings) and --secret flags.
_SECRET_PATTERNS = [
    (re.compile(r"\bak_[A-Za-z0-9_-]{8,}"), lambda m: m.group(0)[:12] + "…[redacted]"),
    (re.compile(r"\bhf_[A-Za-z0-9_-]{16,}"), lambda m: "hf_…[redacted]"),  # Hugging Face hub tokens
    (re.compile(r"(?i)(bearer\s+)[^\s\"',]+"), lambda m: m.group(1) + "[redacted]"),
    (
        re.compile(r"(?i)((?:password|secret|api[_-]?key|token)[\"']?\s*[:=]\s*[\"']?)[^\s\"',}]+"),
        lambda m: m.group(1) + "[redacted]",
    ),
    (re.compile(r"(?i)(--(?:api-key|password|secret|token)[=\s]+)[^\s\"',]+"), lambda m: m.group(1) + "[redacted]"),
]
_SECRET_FIELD = re.compile(r"(?i)password|secret|api[_-]?key|token$|authorization")
_SECRET_FLAG = re.compile(r"(?i)--(?:api-key|password|secret|token)")


def redact(text: str) -> str:
    for pattern, repl in _SECRET_PATTERNS:
        text = pattern.sub(repl, text)
    return text


def _redact_fields(value: object, name: str = "") -> object:
    """Structured log fields, with secrets masked by field name and by content."""
    if isinstance(value, str):
        return "[redacted]" if _SECRET_FIELD.search(name) else redact(value)
    if isinstance(value, dict):
        return {k: _redact_fields(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):  # an argv: the item after --api-key is a secret too
        out, hide = [], False
        for item in value:
            out.append("[redacted]" if hide and isinstance(item, str) else _redact_fields(item, name))
            hide = isinstance(item, str) and bool(_SECRET_FLAG.fullmatch(item))
        return out
    return value


class RedactingFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        extra = getattr(record, "fields", None)
        if isinstance(extra, dict):
            entry.update({k: _redact_fields(v, str(k)) for k, v in extra.items()})
        if record.exc_info:
            entry["exc"] = redact(self.formatException(record.exc_info))
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """Lines for people; tracebacks are redacted like messages."""

    def formatException(self, ei) -> str:  # noqa: N802 - logging's name
        return redact(super().formatException(ei))


class PrivateRotatingFileHandler(logging.handlers.RotatingFileHandler):
    """A rotated log file readable by the daemon's user alone (0600), whatever the umask."""

    def _open(self) -> io.TextIOWrapper:
        return open_private(self.baseFilename, self.mode, encoding=self.encoding, errors=self.errors)


def setup_logging(level: str = "info", fmt: str = "json", log_dir: Path | None = None) -> None:
    """Configure the root logger: stderr (journald under systemd) and a rotated file."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    formatter: logging.Formatter = (
        JsonFormatter() if fmt == "json" else TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_dir is not None:
        log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        private_dir(log_dir)
        for old in log_dir.glob("appliance.log*"):  # rotated files of an earlier start, perhaps written 0644
            private_file(old)
        handlers.append(PrivateRotatingFileHandler(log_dir / "appliance.log", maxBytes=20 * 1024 * 1024, backupCount=5))
    for handler in handlers:
        handler.setFormatter(formatter)
        handler.addFilter(RedactingFilter())
        root.addHandler(handler)
    root.setLevel(level.upper())
    for noisy in ("uvicorn.access", "httpx", "httpcore", "alembic.runtime.migration", "apscheduler"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
