"""Sign-in throttling: exponential backoff per client address and per account.

Two records of failed sign-ins, each kept for ``WINDOW`` seconds:

* **Per address** (the client address the daemon determined). After
  ``ADDRESS_FREE`` failures, each further attempt from that address waits
  ``2 ** (n - ADDRESS_FREE)`` seconds (n failures so far) after its last failure, at most
  ``ADDRESS_MAX_DELAY``; after ``ADDRESS_LIMIT`` failures in the window the
  address is refused until the oldest of them leaves the window. A guesser on
  one address is slowed, then stopped, whichever accounts it tries.
* **Per account**, from all addresses together. After ``ACCOUNT_FREE``
  failures, attempts on the account wait ``2 ** (n - ACCOUNT_FREE)`` seconds
  after its last failure, capped at ``ACCOUNT_MAX_DELAY`` (a few seconds), and
  only for addresses that have failed a sign-in themselves. So failures from
  other addresses never lock the real user out: from a clean address the right
  password signs in at once, and a distributed guesser gets at most one try
  per fresh address plus one per few seconds.

A success clears the account's record (not the address's). ``unlock`` clears an
account (and optionally an address) for the admin socket's
``appliancectl users unlock``. Records live in memory: a restart forgives,
which is acceptable for a limit whose job is to make guessing slow; the argon2
cost stays the floor. The number of records is bounded (``MAX_SUBJECTS``).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass

WINDOW = 15 * 60.0
ADDRESS_FREE = 3
ADDRESS_MAX_DELAY = 60.0
ADDRESS_LIMIT = 20
ACCOUNT_FREE = 5
ACCOUNT_MAX_DELAY = 5.0
MAX_SUBJECTS = 10_000


@dataclass(frozen=True)
class Wait:
    """Why and for how long a sign-in attempt must wait."""

    seconds: int
    reason: str  # "address" or "account"

    @property
    def message(self) -> str:
        where = "from this address" if self.reason == "address" else "for this account"
        return f"Too many failed sign-ins {where}; try again in {self.seconds} s."


def _backoff(failures: int, free: int, cap: float) -> float:
    if failures < free:
        return 0.0
    return min(cap, 2.0 ** min(failures - free, 30))


class LoginThrottle:
    def __init__(self, window: float = WINDOW, clock=time.monotonic):
        self.window = window
        self._clock = clock
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def account(username: str) -> str:
        return f"user:{username.strip().lower()[:64]}"

    @staticmethod
    def address(client: str | None) -> str:
        return f"ip:{client or 'unknown'}"

    def _recent(self, subject: str, now: float) -> deque[float]:
        times = self._failures.get(subject)
        if times is None:
            return deque()
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._failures[subject]
        return times

    def retry_after(self, username: str, client: str | None) -> Wait | None:
        """How long this attempt must wait, or None if it may go ahead now."""
        now = self._clock()
        with self._lock:
            by_address = self._recent(self.address(client), now)
            by_account = self._recent(self.account(username), now)
            address_wait = 0.0
            if len(by_address) >= ADDRESS_LIMIT:
                address_wait = by_address[len(by_address) - ADDRESS_LIMIT] + self.window - now
            if by_address:
                address_wait = max(
                    address_wait, by_address[-1] + _backoff(len(by_address), ADDRESS_FREE, ADDRESS_MAX_DELAY) - now
                )
            account_wait = 0.0
            if by_account and by_address:  # a clean address is never held back by others' failures
                account_wait = by_account[-1] + _backoff(len(by_account), ACCOUNT_FREE, ACCOUNT_MAX_DELAY) - now
        if address_wait <= 0 and account_wait <= 0:
            return None
        if address_wait >= account_wait:
            return Wait(max(1, math.ceil(address_wait)), "address")
        return Wait(max(1, math.ceil(account_wait)), "account")

    def failed(self, username: str, client: str | None) -> None:
        now = self._clock()
        with self._lock:
            if len(self._failures) > MAX_SUBJECTS:
                for subject in list(self._failures):
                    self._recent(subject, now)
                while len(self._failures) > MAX_SUBJECTS:  # still full: forget the stalest record
                    stalest = min(self._failures, key=lambda s: self._failures[s][-1])
                    del self._failures[stalest]
            for subject in (self.account(username), self.address(client)):
                times = self._failures.setdefault(subject, deque())
                times.append(now)
                while len(times) > ADDRESS_LIMIT * 2:
                    times.popleft()

    def succeeded(self, username: str) -> None:
        with self._lock:
            self._failures.pop(self.account(username), None)

    def unlock(self, username: str, client: str | None = None) -> int:
        """Forget the account's failures (and the address's, if given); return how many were forgotten."""
        now = self._clock()
        with self._lock:
            forgotten = len(self._recent(self.account(username), now))
            self._failures.pop(self.account(username), None)
            if client:
                forgotten += len(self._recent(self.address(client), now))
                self._failures.pop(self.address(client), None)
        return forgotten
