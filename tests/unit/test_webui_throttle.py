"""Sign-in throttling: 20 failures per user name or per address, then Retry-After."""

from __future__ import annotations

from appliance.webui.throttle import LIMIT, WINDOW, LoginThrottle


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def test_twenty_failures_throttle_the_user_then_the_window_forgives():
    clock = Clock()
    t = LoginThrottle(clock=clock)
    user, ip = t.subjects("Alice", "10.0.0.1")
    for _ in range(LIMIT - 1):
        t.failed(user, ip)
    assert t.retry_after(user, ip) is None
    t.failed(user, ip)
    wait = t.retry_after(user, ip)
    assert wait is not None and 0 < wait <= WINDOW
    assert t.retry_after(*t.subjects("alice", "10.9.9.9")) is not None  # same user, other address (names fold case)
    clock.now += WINDOW + 1
    assert t.retry_after(user, ip) is None


def test_one_address_guessing_many_users_is_throttled():
    t = LoginThrottle(clock=Clock())
    for i in range(LIMIT):
        t.failed(*t.subjects(f"user{i}", "10.0.0.2"))
    assert t.retry_after(*t.subjects("someone-else", "10.0.0.2")) is not None
    assert t.retry_after(*t.subjects("someone-else", "10.0.0.3")) is None


def test_success_clears_the_user_but_not_the_address():
    t = LoginThrottle(clock=Clock())
    user, ip = t.subjects("bob", "10.0.0.4")
    for _ in range(LIMIT):
        t.failed(user, ip)
    t.succeeded(user)
    assert t.retry_after(user) is None
    assert t.retry_after(ip) is not None


def test_retry_after_counts_down_to_the_oldest_failure_leaving_the_window():
    clock = Clock()
    t = LoginThrottle(limit=3, window=60, clock=clock)
    for _ in range(3):
        t.failed("user:x")
        clock.now += 10
    assert t.retry_after("user:x") == 60 - 30
