"""The per-address cap on anonymous connections: who is closed, who is kept, who is not counted."""

from __future__ import annotations

from appliance.api.peer_guard import CONNECTION_KEY, PeerGuard, Ticket, mark_authenticated


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
