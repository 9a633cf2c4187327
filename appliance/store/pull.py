"""Where a pull may go: the SSRF checks of its URL and of every redirect hop.

Only ``http``/``https``. The host is resolved here and *every* address must be
public (not loopback, private, link-local, CGNAT, multicast, reserved …) unless
the host or address is in ``allow_private_pull_hosts``. The connection then goes
to the address that was checked (the URL is pinned to it; Host header and TLS
SNI keep the name), so a second DNS answer cannot swap in an internal address.
The download itself lives in :mod:`appliance.store.download`.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from appliance.errors import BadRequest
from appliance.store.errors import PullNotAllowed, UpstreamError

__all__ = ["Target", "check_url", "embedded_ipv4", "resolve_checked"]


@dataclass(frozen=True)
class Target:
    """A checked pull URL: pinned to the checked address, with the Host header and TLS SNI of its name."""

    url: str  # pinned to the checked address
    host_header: str
    sni: str | None


def _allowed(host: str, address: ipaddress.IPv4Address | ipaddress.IPv6Address, allow: Iterable[str]) -> bool:
    for entry in allow:
        entry = entry.strip().lower().strip("[]")
        if not entry:
            continue
        if entry == host.lower().strip("[]"):
            return True
        try:
            if address in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue
    return False


_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


def embedded_ipv4(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address tunnels to, if it is one of the wrapping forms.

    IPv4-mapped (``::ffff:a.b.c.d``), IPv4-compatible (``::a.b.c.d``), 6to4
    (``2002:AABB:CCDD::/48``), Teredo (``2001:0::/32``; the client address is the
    last 32 bits XOR ``0xffffffff``) and NAT64 (``64:ff9b::/96``, and the low 32
    bits of the local-use ``64:ff9b:1::/48``).
    """
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]  # (server, client); the client is what a packet would reach
    low32 = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if any(address in net for net in _NAT64):
        return low32
    if address in _IPV4_COMPATIBLE and int(address) > 0xFFFF:  # not ::, ::1 and the like
        return low32
    return None


def _why_internal(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    inner = embedded_ipv4(address)
    if inner is not None:
        why = _why_plain(inner)
        if why is not None:
            return f"{why} (tunnelled to {inner})"
        if any(address in net for net in _NAT64):
            return None  # a NAT64 gateway's public prefix: the IPv4 address it translates to decides
    return _why_plain(address)


def _why_plain(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_private:
        return "a private network"
    if address.is_multicast:
        return "multicast"
    if (
        address.is_unspecified
        or address.is_reserved
        or not address.is_global
        or (isinstance(address, ipaddress.IPv6Address) and address.is_site_local)
    ):
        return "a non-public network"
    return None


def resolve_checked(host: str, port: int, allow: Iterable[str]) -> str:
    """The address to connect to, after checking every address the name resolves to."""
    allow = list(allow)
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise UpstreamError(f"cannot resolve host {host!r}") from None
    addresses = []
    for info in infos:
        addr = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        addresses.append(addr)
    if not addresses:
        raise UpstreamError(f"host {host!r} has no address")
    for addr in addresses:
        why = _why_internal(addr)
        if why is not None and not _allowed(host, addr, allow):
            raise PullNotAllowed(
                f"pulls may not reach {host} ({addr} is {why}); an admin can add the host to allow_private_pull_hosts"
            )
    # Connect to a checked address; IPv4 first, as most model hosts and local mirrors serve it.
    return str(next((a for a in addresses if a.version == 4), addresses[0]))


def check_url(url: str, allow: Iterable[str]) -> Target:
    """Validate a pull URL and pin it to a checked address."""
    if not isinstance(url, str) or len(url) > 4096 or any(ord(c) < 33 for c in url):
        raise BadRequest("invalid URL", param="url", code="invalid_url")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise BadRequest("invalid URL", param="url", code="invalid_url") from None
    if parts.scheme not in ("http", "https"):
        raise PullNotAllowed("only http and https URLs can be pulled", param="url")
    host = parts.hostname
    if not host:
        raise BadRequest("the URL has no host", param="url", code="invalid_url")
    port = port or (443 if parts.scheme == "https" else 80)
    address = resolve_checked(host, port, allow)
    shown = f"[{address}]" if ":" in address else address
    pinned = parts._replace(netloc=f"{shown}:{port}").geturl()
    default_port = 443 if parts.scheme == "https" else 80
    host_header = (f"[{host}]" if ":" in host else host) + ("" if port == default_port else f":{port}")
    return Target(url=pinned, host_header=host_header, sni=host if parts.scheme == "https" else None)
