"""Sign-in throttling: exponential backoff per address (then a refusal), a capped delay per account."""

from __future__ import annotations

from appliance.webui.throttle import (
    ACCOUNT_FREE,
    ACCOUNT_MAX_DELAY,
    ADDRESS_FREE,
    ADDRESS_LIMIT,
    ADDRESS_MAX_DELAY,
    MAX_SUBJECTS,
    WINDOW,
    LoginThrottle,
)


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def _fail_when_allowed(t: LoginThrottle, clock: Clock, user: str, address: str) -> None:
    """One failed attempt, made as soon as the throttle lets this address try."""
    wait = t.retry_after(user, address)
    if wait is not None:
        clock.now += wait.seconds
    assert t.retry_after(user, address) is None
    t.failed(user, address)


def test_an_address_is_slowed_with_doubling_delays_then_refused_for_the_window():
    clock = Clock()
    t = LoginThrottle(clock=clock)
    for _ in range(ADDRESS_FREE):
        assert t.retry_after("alice", "10.0.0.1") is None
        t.failed("alice", "10.0.0.1")
    waits = []
    for _ in range(6):
        wait = t.retry_after("alice", "10.0.0.1")
        assert wait is not None and wait.reason == "address"
        waits.append(wait.seconds)
        clock.now += wait.seconds
        t.failed("alice", "10.0.0.1")
    assert waits == [1, 2, 4, 8, 16, 32]
    assert t.retry_after("bob", "10.0.0.1") is not None  # the address, whichever account it tries
    while len(t._failures["ip:10.0.0.1"]) < ADDRESS_LIMIT:
        _fail_when_allowed(t, clock, "alice", "10.0.0.1")
    wait = t.retry_after("alice", "10.0.0.1")
    assert wait is not None and wait.seconds > ADDRESS_MAX_DELAY  # refused until failures leave the window
    assert "from this address" in wait.message and f"try again in {wait.seconds} s" in wait.message
    clock.now += WINDOW + 1
    assert t.retry_after("alice", "10.0.0.1") is None


def test_failures_from_many_addresses_never_hold_back_a_clean_address():
    """The lockout the old limit allowed: many failures on `admin`; the admin elsewhere signs in at once."""
    clock = Clock()
    t = LoginThrottle(clock=clock)
    for i in range(200):
        t.failed("admin", f"10.1.{i // 250}.{i % 250}")
    assert t.retry_after("admin", "192.168.7.7") is None
    assert t.retry_after("Admin ", "192.168.7.7") is None


def test_account_delay_is_capped_and_applies_to_addresses_that_failed_before():
    clock = Clock()
    t = LoginThrottle(clock=clock)
    for i in range(100):
        t.failed("admin", f"10.2.0.{i}")  # one failure from each of 100 addresses
    wait = t.retry_after("admin", "10.2.0.5")  # an address with a failure: the account's capped delay
    assert wait is not None and wait.reason == "account" and 1 <= wait.seconds <= ACCOUNT_MAX_DELAY
    assert "for this account" in wait.message
    clock.now += ACCOUNT_MAX_DELAY
    assert t.retry_after("admin", "10.2.0.5") is None
    assert t.retry_after("someone", "10.2.0.5") is None  # other accounts from that address: not delayed


def test_account_delay_starts_after_the_free_failures():
    clock = Clock()
    t = LoginThrottle(clock=clock)
    for i in range(ACCOUNT_FREE - 1):
        t.failed("carol", f"10.3.0.{i}")
    assert t.retry_after("carol", "10.3.0.0") is None
    t.failed("carol", "10.3.0.9")
    wait = t.retry_after("carol", "10.3.0.0")
    assert wait is not None and wait.reason == "account" and wait.seconds == 1


def test_success_clears_the_account_but_not_the_address():
    clock = Clock()
    t = LoginThrottle(clock=clock)
    for i in range(ACCOUNT_FREE + 3):
        t.failed("bob", f"10.4.0.{i}")
    for _ in range(ADDRESS_FREE + 2):
        t.failed("x", "10.4.0.200")
    t.succeeded("bob")
    assert t.retry_after("bob", "10.4.0.1") is None
    assert t.retry_after("bob", "10.4.0.200") is not None


def test_unlock_forgets_the_account_and_optionally_an_address():
    clock = Clock()
    t = LoginThrottle(clock=clock)
    for _ in range(ADDRESS_LIMIT):
        t.failed("admin", "10.5.0.1")
    assert t.retry_after("admin", "10.5.0.1") is not None
    assert t.unlock("admin") == ADDRESS_LIMIT
    assert t.retry_after("admin", "10.5.0.1") is not None  # the address is still refused
    assert t.unlock("admin", "10.5.0.1") == ADDRESS_LIMIT
    assert t.retry_after("admin", "10.5.0.1") is None
    assert t.unlock("nobody") == 0


def test_the_record_count_is_bounded():
    clock = Clock()
    t = LoginThrottle(clock=clock)
    for i in range(MAX_SUBJECTS + 500):
        t.failed(f"u{i}", "10.6.0.1")
    assert len(t._failures) <= MAX_SUBJECTS + 2
