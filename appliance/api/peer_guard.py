"""A cap per client address on connections that have not shown a credential.

Every connection from an address starts anonymous. Once a request on it has
presented a valid API key or console session (the access guard and the console
gate say so through :func:`mark_authenticated`), the connection is trusted and
no longer counted. An address may hold at most ``per_address`` anonymous
connections that are waiting for the client (opening, idle between requests,
or part-way through its headers or body). When one more arrives, the address's
oldest waiting anonymous connection is closed: the newcomer always gets its
turn, so a probe or a person that sends a whole request at once is served
however many stalled sockets the same address holds, while the stalled ones
can never add up to the listener's connection limit.

Connections being answered (request received, response not finished) are
never closed for this: they cost the client nothing to hold, but they are
real work the appliance accepted. Connections from the configured reverse
proxies (``trusted_proxies``) are not counted: every client behind a proxy
shares its address, and the proxy applies its own limits per client.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Protocol

log = logging.getLogger("appliance.api.peer_guard")

#: Seconds between two warnings about the same address's closed connections.
WARN_EVERY_S = 60.0
#: Addresses remembered for that; past it, those warned longest ago are forgotten.
WARNED_ADDRESSES = 1024

#: Scope key under which the public listener's protocol hands each request its :class:`Ticket`.
CONNECTION_KEY = "appliance.connection"


class Closable(Protocol):
    def evict(self) -> None:
        """Close the connection: its address holds too many anonymous ones."""


class Ticket:
    """One connection's standing: anonymous or authenticated, waiting for the client or being answered."""

    __slots__ = ("_address", "_guard", "authenticated", "busy", "owner")

    def __init__(self, owner: Closable, guard: PeerGuard | None, address: str):
        self.owner = owner
        self._guard = guard
        self._address = address
        self.authenticated = False
        self.busy = False

    def trust(self) -> None:
        """The connection presented a valid credential: it leaves the anonymous count for good."""
        if not self.authenticated:
            self.authenticated = True
            if self._guard is not None:
                self._guard.closed(self._address, self)


def mark_authenticated(scope: Mapping[str, object]) -> None:
    """Tell the listener that the connection carrying ``scope`` presented a valid credential."""
    ticket = scope.get(CONNECTION_KEY)
    if isinstance(ticket, Ticket):
        ticket.trust()


def _networks(entries: list[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network] | None:
    """The networks of ``entries`` (addresses or CIDR ranges); None when one is ``*`` (every peer exempt)."""
    networks = []
    for entry in entries:
        if entry.strip() == "*":
            return None
        try:
            networks.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError:
            continue  # a name: uvicorn matches those for X-Forwarded-For; a peer here is always an address
    return networks


class PeerGuard:
    """Anonymous connections per address, oldest first; the oldest waiting one is closed past the cap."""

    def __init__(self, per_address: int, exempt: list[str] | None = None):
        self.per_address = per_address
        self._by_address: dict[str, OrderedDict[Ticket, None]] = {}
        self._exempt = _networks(exempt or [])
        self.evicted = 0
        self._reports: dict[str, tuple[float, int]] = {}  # address -> (when its closes were last logged, closes since)

    def _is_exempt(self, address: str) -> bool:
        if self._exempt is None:
            return True
        if not self._exempt:
            return False
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in self._exempt)

    def opened(self, address: str, ticket: Ticket) -> None:
        if self._is_exempt(address):
            return
        held = self._by_address.setdefault(address, OrderedDict())
        held[ticket] = None
        if len(held) <= self.per_address:
            return
        for other in list(held):
            if len(held) <= self.per_address:
                break
            if other is ticket or other.busy:
                continue
            del held[other]
            self.evicted += 1
            other.owner.evict()
            self._tell(address)

    def _tell(self, address: str) -> None:
        """Log a close, at most once a minute per address, with what the admin can do about a client that needs more."""
        now = time.monotonic()
        logged, since = self._reports.get(address, (-WARN_EVERY_S, 0))
        if now - logged < WARN_EVERY_S:
            self._reports[address] = (logged, since + 1)
            return
        if address not in self._reports and len(self._reports) >= WARNED_ADDRESSES:
            for old in sorted(self._reports, key=lambda a: self._reports[a][0])[: WARNED_ADDRESSES // 2]:
                del self._reports[old]
        self._reports[address] = (now, 0)
        log.warning(
            "closed %d connection(s) from %s that had not shown an API key or session: the address held more than %d "
            "(anonymous_connections_per_address). A client that opens more than that at once, such as a connection "
            "pool's first burst, needs a higher setting; stalled or trickling sockets are what the cap is for.",
            since + 1,
            address,
            self.per_address,
        )

    def closed(self, address: str, ticket: Ticket) -> None:
        held = self._by_address.get(address)
        if held is None:
            return
        held.pop(ticket, None)
        if not held:
            del self._by_address[address]

    def anonymous(self, address: str) -> int:
        """How many anonymous connections ``address`` holds now."""
        return len(self._by_address.get(address, ()))
