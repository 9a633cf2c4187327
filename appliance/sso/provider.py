"""The identity provider over HTTP: discovery, signing keys and the token endpoint.

Discovery (``<issuer>/.well-known/openid-configuration``) is cached for
``METADATA_TTL`` seconds, the keys (``jwks_uri``) until a token names a ``kid``
they lack; then they are fetched again, at most once per ``KEY_REFRESH_SECONDS``
so forged ``kid`` values cannot turn the console into a load generator. Every
call has a timeout and follows no redirects. The client secret goes only into
the token request's Authorization header.
"""

from __future__ import annotations

import asyncio
import re
import time
from base64 import b64encode
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import quote

import httpx
from joserfc.errors import JoseError
from joserfc.jwk import KeySet
from pydantic import SecretStr

from appliance.jsontypes import JsonObject
from appliance.sso.refusals import ProviderUnavailable, SignOnRefused

TIMEOUT = httpx.Timeout(10.0, connect=5.0)
METADATA_TTL = 3600.0
KEY_REFRESH_SECONDS = 10.0
MAX_DOCUMENT_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ProviderMetadata:
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    end_session_endpoint: str | None


def _optional_url(document: JsonObject, name: str) -> str | None:
    value = document.get(name)
    return value if isinstance(value, str) and value.startswith(("https://", "http://")) else None


def _url(document: JsonObject, name: str) -> str:
    value = _optional_url(document, name)
    if value is None:
        raise ProviderUnavailable(f"provider metadata lacks {name}")
    return value


def _short(value: object) -> str:
    """A provider's error code, kept to what such codes are made of."""
    return re.sub(r"[^A-Za-z0-9_.-]", "", str(value))[:64] or "unknown"


class IdentityProvider:
    def __init__(
        self,
        issuer: str,
        client_id: str,
        client_secret: SecretStr | None,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.issuer = issuer
        self._client_id = client_id
        self._secret = client_secret
        self._transport = transport
        self._clock = clock
        self._metadata: tuple[float, ProviderMetadata] | None = None
        self._keys: KeySet | None = None
        self._keys_fetched = float("-inf")
        self._lock = asyncio.Lock()

    async def _get_json(
        self,
        client: httpx.AsyncClient,
        method: str,
        url: str,
        data: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, JsonObject]:
        try:
            response = await client.request(method, url, data=data, headers=headers)
        except httpx.HTTPError as exc:
            raise ProviderUnavailable(f"provider unreachable ({type(exc).__name__})") from None
        if len(response.content) > MAX_DOCUMENT_BYTES:
            raise ProviderUnavailable("provider answer too large")
        try:
            body = response.json()
        except ValueError:
            raise ProviderUnavailable(f"provider answered {response.status_code} without JSON") from None
        if not isinstance(body, dict):
            raise ProviderUnavailable("provider answered JSON that is not an object")
        return response.status_code, body

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=TIMEOUT, follow_redirects=False, transport=self._transport)

    async def metadata(self) -> ProviderMetadata:
        cached = self._metadata
        if cached and cached[0] > self._clock():
            return cached[1]
        async with self._client() as client:
            status, doc = await self._get_json(client, "GET", self.issuer.rstrip("/") + "/.well-known/openid-configuration")
        if status != 200:
            raise ProviderUnavailable(f"provider discovery answered {status}")
        if not isinstance(doc.get("issuer"), str) or doc["issuer"].rstrip("/") != self.issuer.rstrip("/"):
            raise ProviderUnavailable("provider metadata names another issuer")
        meta = ProviderMetadata(
            issuer=str(doc["issuer"]),
            authorization_endpoint=_url(doc, "authorization_endpoint"),
            token_endpoint=_url(doc, "token_endpoint"),
            jwks_uri=_url(doc, "jwks_uri"),
            end_session_endpoint=_optional_url(doc, "end_session_endpoint"),
        )
        self._metadata = (self._clock() + METADATA_TTL, meta)
        return meta

    def _knows(self, kid: str | None) -> bool:
        if self._keys is None:
            return False
        return kid is None or any(key.kid == kid for key in self._keys.keys)

    async def keys_for(self, kid: str | None) -> KeySet:
        """The provider's keys, fetched again when they lack ``kid`` (rotation), at most every few seconds."""
        async with self._lock:
            if not self._knows(kid) and self._clock() - self._keys_fetched >= KEY_REFRESH_SECONDS:
                meta = await self.metadata()
                async with self._client() as client:
                    status, doc = await self._get_json(client, "GET", meta.jwks_uri)
                self._keys_fetched = self._clock()
                if status != 200:
                    raise ProviderUnavailable(f"provider keys answered {status}")
                try:
                    self._keys = KeySet.import_key_set({"keys": doc["keys"]})
                except (JoseError, ValueError, TypeError, KeyError):
                    raise ProviderUnavailable("provider keys unreadable") from None
            if self._keys is None or not self._knows(kid):
                raise SignOnRefused("id token signed with an unknown key")
            return self._keys

    async def exchange(self, code: str, code_verifier: str, redirect_uri: str) -> str:
        """Trade the authorization code for the ID token (the console needs no access token)."""
        meta = await self.metadata()
        form = {"grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri, "code_verifier": code_verifier}
        headers = {"Accept": "application/json"}
        if self._secret is not None:  # client_secret_basic (RFC 6749 2.3.1: form-encoded id and secret)
            pair = f"{quote(self._client_id, safe='')}:{quote(self._secret.get_secret_value(), safe='')}"
            headers["Authorization"] = "Basic " + b64encode(pair.encode()).decode()
        else:
            form["client_id"] = self._client_id
        async with self._client() as client:
            status, body = await self._get_json(client, "POST", meta.token_endpoint, data=form, headers=headers)
        if status != 200:
            raise SignOnRefused(f"token endpoint refused the code ({_short(body.get('error'))})")
        token = body.get("id_token")
        if not isinstance(token, str):
            raise SignOnRefused("token endpoint returned no id token")
        return token
