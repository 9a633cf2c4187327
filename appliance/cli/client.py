"""How the CLI reaches the daemon.

On the box: the admin Unix socket in the data dir (no token; the socket's
owner and group are the appliance's). Remotely: ``--url`` and an admin API key
(``--api-key`` or ``APPLIANCE_API_KEY``), over https verified against ``--ca-file``
(``APPLIANCE_CA_FILE``) alone, else the system's trusted CAs plus the data dir's own CA
(``tls/ca.crt``) when there is one.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from pathlib import Path

import click
import httpx

from appliance.jsontypes import JsonValue
from appliance.settings import Settings, load_settings
from appliance.tls.generate import TlsFiles

#: A query parameter's value as httpx takes it.
QueryValue = str | int | float | bool | None


def trusted_cas(ca_file: str | None, settings: Settings | None) -> ssl.SSLContext:
    """What a remote daemon's certificate is checked against: the named CA file alone, else the system's CAs
    plus this box's own CA when its data dir has one."""
    box_ca = TlsFiles.of(settings.data_dir).ca_cert if settings is not None else None
    chosen = Path(ca_file) if ca_file else None
    try:
        if chosen is not None:
            return ssl.create_default_context(cafile=str(chosen))
        context = ssl.create_default_context()
        if box_ca is not None and box_ca.is_file():
            chosen = box_ca
            context.load_verify_locations(cafile=str(box_ca))
        return context
    except (OSError, ssl.SSLError) as exc:
        raise click.ClickException(f"cannot use {chosen} as the CA file: {exc}") from None


def admin_client(ctx: click.Context, timeout: float = 600.0) -> httpx.Client:
    obj = ctx.find_root().obj or {}
    url, api_key = obj.get("url"), obj.get("api_key")
    if url:
        if not api_key:
            raise click.UsageError("--url needs an admin key: pass --api-key or set APPLIANCE_API_KEY")
        return httpx.Client(
            base_url=url.rstrip("/"),
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout,
            verify=trusted_cas(obj.get("ca_file"), obj.get("settings")),
        )
    settings = obj.get("settings") or load_settings()
    sock = settings.admin_socket
    if not sock.exists():
        raise click.ClickException(
            f"the appliance is not running for data dir {settings.data_dir} (no {sock.name}); start it with `appliancectl serve`"
        )
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://appliance", timeout=timeout)


def daemon_reachable(ctx: click.Context) -> bool:
    """Whether commands go to a daemon: one named by --url, or the local one whose admin socket exists."""
    obj = ctx.find_root().obj or {}
    if obj.get("url"):
        return True
    settings = obj.get("settings") or load_settings()
    return bool(settings.admin_socket.exists())


def check(response: httpx.Response) -> JsonValue:
    """The JSON body of a successful response, or a ClickException with the API's message."""
    if response.status_code >= 400:
        try:
            message = response.json()["error"]["message"]
        except Exception:
            message = response.text[:500] or response.reason_phrase
        raise click.ClickException(f"{message} (HTTP {response.status_code})")
    if not response.content:
        return None
    if response.headers.get("content-type", "").startswith("application/json"):
        return response.json()
    return response.text


def request(
    ctx: click.Context, method: str, path: str, *, json: object = None, params: Mapping[str, QueryValue] | None = None
) -> JsonValue:
    """``method path`` on the admin API, with an optional JSON body and query parameters."""
    try:
        with admin_client(ctx) as client:
            return check(client.request(method, path, json=json, params=params))
    except httpx.TransportError as exc:
        raise click.ClickException(f"cannot reach the appliance: {exc}") from None


def subgroup(group: click.Group, name: str, help_text: str) -> click.Group:
    """The named sub-group of ``group``, created if no module registered it yet."""
    existing = group.commands.get(name)
    if existing is None:
        existing = click.Group(name, help=help_text)
        group.add_command(existing)
    assert isinstance(existing, click.Group)
    return existing
