"""Console sessions: server-side rows keyed by the hash of a random cookie value.

The cookie carries 256 random bits and nothing else. The database keeps only
the sha256 of that value (in the small ``kv`` table, ``session:<hash>``), with
the user id and the expiry, so a database dump holds no usable session, logout
and password changes revoke sessions for real, and sessions survive a restart.
Sessions last ``SESSION_TTL`` from sign-in and end after ``IDLE_TTL`` without a
request. Cookies are HttpOnly, SameSite=Strict, Path=/, and Secure when the
console is served over https.

The console's HMAC secret (for CSRF tokens) is ``settings.session_secret`` or,
when unset, 32 random bytes generated once into ``<data dir>/console.secret``
with mode 0600.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from litestar import Response
from litestar.datastructures import Cookie
from sqlalchemy import Engine, delete, select
from sqlmodel import col

from appliance.db.engine import session
from appliance.db.tables import Setting

COOKIE = "appliance_session"
PREFIX = "session:"
SESSION_TTL = 12 * 3600.0
IDLE_TTL = 2 * 3600.0
TOUCH_EVERY = 60.0  # write last-seen at most once a minute per session
SECRET_FILE = "console.secret"


def load_secret(configured: str | None, data_dir: Path) -> bytes:
    """The configured secret, or the one generated once into the data dir (mode 0600)."""
    if configured:
        return configured.encode()
    path = data_dir / SECRET_FILE
    try:
        return bytes.fromhex(path.read_text().strip())
    except FileNotFoundError:
        pass
    data_dir.mkdir(parents=True, exist_ok=True)
    value = secrets.token_bytes(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process won the race: use its secret
        return bytes.fromhex(path.read_text().strip())
    with os.fdopen(fd, "w") as handle:
        handle.write(value.hex())
        handle.flush()
        os.fsync(handle.fileno())
    return value


def _row_key(sid: str) -> str:
    return PREFIX + hashlib.sha256(sid.encode()).hexdigest()[:56]  # fits kv.key (64)


@dataclass(frozen=True, slots=True)
class SessionRecord:
    user_id: int
    created: float
    expires: float
    seen: float


class SessionStore:
    def __init__(self, db: Engine, clock=time.time):
        self._db = db
        self._clock = clock

    def create(self, user_id: int) -> str:
        now = self._clock()
        sid = secrets.token_urlsafe(32)
        record = {"uid": user_id, "created": now, "expires": now + SESSION_TTL, "seen": now}
        with session(self._db) as s:
            s.add(Setting(key=_row_key(sid), value=json.dumps(record)))
            s.commit()
        return sid

    def get(self, sid: str | None) -> SessionRecord | None:
        if not sid or len(sid) > 100:
            return None
        key = _row_key(sid)
        now = self._clock()
        with session(self._db) as s:
            row = s.get(Setting, key)
            if row is None:
                return None
            data = json.loads(row.value)
            if data["expires"] <= now or data["seen"] + IDLE_TTL <= now:
                s.delete(row)
                s.commit()
                return None
            if now - data["seen"] >= TOUCH_EVERY:
                data["seen"] = now
                row.value = json.dumps(data)
                s.commit()
        return SessionRecord(data["uid"], data["created"], data["expires"], data["seen"])

    def delete(self, sid: str | None) -> None:
        if not sid:
            return
        with session(self._db) as s:
            s.execute(delete(Setting).where(col(Setting.key) == _row_key(sid)))
            s.commit()

    def delete_for_user(self, user_id: int, keep: str | None = None) -> int:
        """End every session of a user (password change, disable), except ``keep``."""
        keep_key = _row_key(keep) if keep else None
        removed = 0
        with session(self._db) as s:
            for row in s.execute(select(Setting).where(col(Setting.key).startswith(PREFIX))).scalars():
                if row.key != keep_key and json.loads(row.value).get("uid") == user_id:
                    s.delete(row)
                    removed += 1
            s.commit()
        return removed

    def prune(self) -> int:
        now = self._clock()
        removed = 0
        with session(self._db) as s:
            for row in s.execute(select(Setting).where(col(Setting.key).startswith(PREFIX))).scalars():
                data = json.loads(row.value)
                if data["expires"] <= now or data["seen"] + IDLE_TTL <= now:
                    s.delete(row)
                    removed += 1
            s.commit()
        return removed


def session_cookie(sid: str, secure: bool) -> Cookie:
    return Cookie(key=COOKIE, value=sid, path="/", httponly=True, samesite="strict", secure=secure, max_age=int(SESSION_TTL))


def clear_cookie(response: Response, secure: bool) -> None:
    response.set_cookie(Cookie(key=COOKIE, value="", path="/", httponly=True, samesite="strict", secure=secure, max_age=0))
