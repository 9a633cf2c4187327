"""Sign-ins under way, between the redirect to the provider and its callback.

Each sign-in gets a random ``state`` (sent to the provider), a ``nonce`` (which
the ID token must carry back), a PKCE ``code_verifier``, and a random browser
token set as a short-lived HttpOnly cookie. The callback's state is taken out of
the table whatever happens next, so it works once; it must come back to the
browser that started it, within ``TTL_SECONDS``. Only hashes of the state and
the browser token are kept as keys and for comparison.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from appliance.sso.refusals import SignOnStateRefused

TTL_SECONDS = 600
MAX_PENDING = 10_000


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class PendingSignOn:
    nonce: str
    code_verifier: str
    next_url: str
    browser_digest: str
    expires: float


@dataclass(frozen=True, slots=True)
class Started:
    state: str
    browser: str
    pending: PendingSignOn


class PendingSignOns:
    def __init__(self, ttl: float = TTL_SECONDS, limit: int = MAX_PENDING, clock: Callable[[], float] = time.monotonic):
        self._ttl = ttl
        self._limit = limit
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: OrderedDict[str, PendingSignOn] = OrderedDict()

    def begin(self, next_url: str) -> Started:
        state, browser = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        pending = PendingSignOn(
            nonce=secrets.token_urlsafe(32),
            code_verifier=secrets.token_urlsafe(48),
            next_url=next_url,
            browser_digest=_digest(browser),
            expires=self._clock() + self._ttl,
        )
        with self._lock:
            self._prune()
            while len(self._pending) >= self._limit:
                self._pending.popitem(last=False)  # the oldest sign-in under way gives way
            self._pending[_digest(state)] = pending
        return Started(state=state, browser=browser, pending=pending)

    def take(self, state: str | None, browser: str | None) -> PendingSignOn:
        """The sign-in this callback finishes; it is gone from the table afterwards."""
        if not state or len(state) > 200:
            raise SignOnStateRefused("state missing")
        with self._lock:
            pending = self._pending.pop(_digest(state), None)
        if pending is None:
            raise SignOnStateRefused("state unknown or already used")
        if pending.expires <= self._clock():
            raise SignOnStateRefused("state expired")
        if not browser or not hmac.compare_digest(pending.browser_digest, _digest(browser)):
            raise SignOnStateRefused("state from another browser")
        return pending

    def _prune(self) -> None:
        now = self._clock()
        for key in [k for k, p in self._pending.items() if p.expires <= now]:
            del self._pending[key]
