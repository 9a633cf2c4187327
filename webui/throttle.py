"""Sign-in throttling: after ``LIMIT`` failures in ``WINDOW`` seconds, per user name
and per client address, further attempts get 429 with Retry-After until the
oldest failure leaves the window. A success clears the user's count (not the
address's). Counts live in memory: a restart forgives, which is acceptable for a
limit whose job is to make guessing slow, and the argon2 cost stays the floor.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque

LIMIT = 20
WINDOW = 15 * 60.0
MAX_SUBJECTS = 10_000


class LoginThrottle:
    def __init__(self, limit: int = LIMIT, window: float = WINDOW, clock=time.monotonic):
        self.limit = limit
        self.window = window
        self._clock = clock
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def subjects(username: str, client: str | None) -> tuple[str, str]:
        return f"user:{username.strip().lower()[:64]}", f"ip:{client or 'unknown'}"

    def _recent(self, subject: str, now: float) -> deque[float]:
        times = self._failures.get(subject)
        if times is None:
            return deque()
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._failures[subject]
        return times

    def retry_after(self, *subjects: str) -> int | None:
        """Seconds to wait if any subject is throttled, else None."""
        now = self._clock()
        wait = 0.0
        with self._lock:
            for subject in subjects:
                times = self._recent(subject, now)
                if len(times) >= self.limit:
                    wait = max(wait, times[len(times) - self.limit] + self.window - now)
        return max(1, math.ceil(wait)) if wait > 0 else None

    def failed(self, *subjects: str) -> None:
        now = self._clock()
        with self._lock:
            if len(self._failures) > MAX_SUBJECTS:
                for subject in list(self._failures):
                    self._recent(subject, now)
            for subject in subjects:
                times = self._failures.setdefault(subject, deque())
                times.append(now)
                while len(times) > self.limit * 2:
                    times.popleft()

    def succeeded(self, user_subject: str) -> None:
        with self._lock:
            self._failures.pop(user_subject, None)
