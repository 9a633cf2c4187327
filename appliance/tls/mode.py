"""Which TLS mode the settings ask for, and the names a certificate of this box should carry."""

from __future__ import annotations

import ipaddress
import socket
from typing import Literal

from appliance.settings import Settings

TlsMode = Literal["off", "self-signed", "files"]
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARD_ADDRESSES = ("0.0.0.0", "::", "")


def is_loopback(host: str) -> bool:
    """True when ``host`` (a listen address or name) is reachable from this box only."""
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def tls_mode(settings: Settings) -> TlsMode:
    """The mode in force: ``auto`` is ``self-signed`` when the listener reaches beyond loopback, else ``off``."""
    if settings.tls == "auto":
        return "off" if is_loopback(settings.host) else "self-signed"
    return settings.tls


def _interface_addresses() -> list[str]:
    try:
        import psutil

        found = []
        for addresses in psutil.net_if_addrs().values():
            for address in addresses:
                if address.family in (socket.AF_INET, socket.AF_INET6):
                    found.append(address.address.split("%", 1)[0])  # fe80::1%eth0 -> fe80::1
        return found
    except Exception:  # no psutil, or no permission to list interfaces: the names below still cover the box
        return []


def box_names(settings: Settings) -> list[str]:
    """DNS names and IP addresses a self-signed certificate of this box carries, in a stable order: the host
    name and FQDN, the listen address (every interface's address when it listens on all), loopback, and
    the names of ``allowed_hosts``."""
    wanted: list[str] = [socket.gethostname(), socket.getfqdn()]
    host = settings.host.strip("[]")
    wanted += _interface_addresses() if host in WILDCARD_ADDRESSES else [host]
    wanted += LOOPBACK_NAMES
    for allowed in settings.allowed_hosts:
        if allowed != "*":
            wanted.append(_strip_port(allowed))
    out: list[str] = []
    for name in wanted:
        name = name.strip().lower().rstrip(".")
        if name and name not in out and (_is_ip(name) or _is_dns_name(name)):
            out.append(name)
    return out


def _strip_port(host: str) -> str:
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def _is_dns_name(name: str) -> bool:
    labels = name.split(".")
    return len(name) <= 253 and all(0 < len(lab) <= 63 and lab.replace("-", "").isalnum() and lab.isascii() for lab in labels)
