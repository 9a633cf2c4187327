"""A real OpenID Connect provider (``oidc-provider-mock``) and a daemon that signs in through it.

The provider runs in a thread on ``localhost`` (its issuer is ``http://localhost:<port>``)
while the daemon answers on ``127.0.0.1``: two different sites, as a real
identity provider and console are, so SameSite cookie rules apply in browsers.
The console is registered as a confidential client with the provider; its secret
reaches the daemon through a file in the data dir only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.daemon import RunningDaemon, daemon_env, free_port

GROUP_ROLES = {"llm-admins": "admin", "llm-ops": "operator", "staff": "viewer"}
SECRET_FILE = "oidc-client.secret"


@dataclass
class Provider:
    url: str
    client_id: str
    client_secret: str

    def set_user(self, sub: str, **claims: object) -> None:
        """The claims the provider puts in this user's next ID token."""
        httpx.put(f"{self.url}/users/{sub}", json=claims, timeout=10).raise_for_status()


@contextmanager
def oidc_provider(redirect_uri: str) -> Iterator[Provider]:
    from oidc_provider_mock import run_server_in_thread

    with run_server_in_thread(require_client_registration=True, require_nonce=True) as server:
        url = f"http://localhost:{server.server_port}"
        registered = httpx.post(f"{url}/oauth2/clients", json={"redirect_uris": [redirect_uri]}, timeout=10)
        registered.raise_for_status()
        body = registered.json()
        yield Provider(url=url, client_id=body["client_id"], client_secret=body["client_secret"])


@contextmanager
def sso_daemon(base: Path, **extra: str) -> Iterator[tuple[RunningDaemon, Provider]]:
    """A real daemon whose console signs in through a real provider; local sign-in as ``extra`` says."""
    port = free_port()
    with oidc_provider(f"http://127.0.0.1:{port}/login/oidc/callback") as provider:
        data_dir = base / f"data-{port}"
        data_dir.mkdir(parents=True)
        (data_dir / SECRET_FILE).write_text(provider.client_secret + "\n")
        (data_dir / SECRET_FILE).chmod(0o600)
        env = daemon_env(
            data_dir,
            port,
            APPLIANCE_OIDC_ISSUER=provider.url,
            APPLIANCE_OIDC_CLIENT_ID=provider.client_id,
            APPLIANCE_OIDC_CLIENT_SECRET_FILE=SECRET_FILE,
            APPLIANCE_OIDC_PROVIDER_NAME="Mock IdP",
            APPLIANCE_OIDC_GROUP_ROLES=json.dumps(GROUP_ROLES),
            **extra,
        )
        running = RunningDaemon(data_dir, port, env).start()
        try:
            yield running, provider
        finally:
            running.stop()
