"""The per-address cap on anonymous connections: who is closed, who is kept, who is not counted."""

from __future__ import annotations

from appliance.api.peer_guard import CONNECTION_KEY, WARNED_ADDRESSES, PeerGuard, Ticket, mark_authenticated


class Conn:
    """A connection as the guard sees it: something it can close."""

    def __init__(self, guard: PeerGuard, address: str):
        self.closed = False
        self.ticket = Ticket(self, guard, address)
        self.address = address
        self.guard = guard
        guard.opened(address, self.ticket)

    def evict(self) -> None:
        self.closed = True
        self.guard.closed(self.address, self.ticket)


def test_the_oldest_waiting_connection_makes_room_for_a_newcomer():
    guard = PeerGuard(3)
    conns = [Conn(guard, "10.0.0.1") for _ in range(5)]
    assert [c.closed for c in conns] == [True, True, False, False, False]
    assert guard.anonymous("10.0.0.1") == 3 and guard.evicted == 2


def test_addresses_are_counted_apart():
    guard = PeerGuard(2)
    a = [Conn(guard, "10.0.0.1") for _ in range(2)]
    b = [Conn(guard, "10.0.0.2") for _ in range(2)]
    assert not any(c.closed for c in a + b)


def test_a_connection_being_answered_is_not_closed():
    guard = PeerGuard(2)
    first = Conn(guard, "10.0.0.1")
    first.ticket.busy = True
    second = Conn(guard, "10.0.0.1")
    Conn(guard, "10.0.0.1")
    assert not first.closed and second.closed


def test_a_connection_that_showed_a_credential_leaves_the_count():
    guard = PeerGuard(2)
    keyed = Conn(guard, "10.0.0.1")
    mark_authenticated({CONNECTION_KEY: keyed.ticket})
    others = [Conn(guard, "10.0.0.1") for _ in range(2)]
    assert not keyed.closed and not any(c.closed for c in others)
    assert guard.anonymous("10.0.0.1") == 2
    mark_authenticated({})  # a scope from the admin socket carries no ticket: nothing to do


def test_trusted_proxies_are_not_counted():
    guard = PeerGuard(1, ["127.0.0.1", "10.1.0.0/16", "proxy.example"])
    assert not any(c.closed for c in [Conn(guard, "10.1.2.3") for _ in range(5)])
    assert not any(c.closed for c in [Conn(guard, "127.0.0.1") for _ in range(5)])
    assert [c.closed for c in [Conn(guard, "10.2.0.1") for _ in range(2)]] == [True, False]
    everyone = PeerGuard(1, ["*"])
    assert not any(c.closed for c in [Conn(everyone, "192.0.2.1") for _ in range(3)])


def test_closes_are_logged_once_a_minute_per_address_with_the_setting_to_raise(monkeypatch, caplog):
    clock = [1000.0]
    monkeypatch.setattr("appliance.api.peer_guard.time.monotonic", lambda: clock[0])
    guard = PeerGuard(2)
    with caplog.at_level("WARNING", logger="appliance.api.peer_guard"):
        for _ in range(6):  # 4 closes: the first is logged at once, the next 3 wait for the minute
            Conn(guard, "10.0.0.1")
        Conn(guard, "10.0.0.2")
        for _ in range(2):
            Conn(guard, "10.0.0.2")  # 1 close of another address: logged on its own
        clock[0] += 61
        Conn(guard, "10.0.0.1")  # a minute later: this close and the 3 held back
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert lines[0].startswith("closed 1 connection(s) from 10.0.0.1 ") and "anonymous_connections_per_address" in lines[0]
    assert "more than 2 " in lines[0]
    assert lines[1].startswith("closed 1 connection(s) from 10.0.0.2 ")
    assert lines[2].startswith("closed 4 connection(s) from 10.0.0.1 ")


def test_the_addresses_remembered_for_logging_stay_bounded(caplog):
    guard = PeerGuard(1)
    with caplog.at_level("WARNING", logger="appliance.api.peer_guard"):
        for i in range(WARNED_ADDRESSES + 100):
            address = f"10.{i // 65536}.{i // 256 % 256}.{i % 256}"
            Conn(guard, address)
            Conn(guard, address)  # one close each, logged: every address is new
    assert len(caplog.records) == WARNED_ADDRESSES + 100
    assert len(guard._reports) <= WARNED_ADDRESSES
