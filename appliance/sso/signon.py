"""The single sign-on flow, from the sign-in button to a verified identity.

``begin`` remembers a new sign-in (:mod:`appliance.sso.pending`) and returns the
provider's authorization URL (code flow, PKCE S256, ``state`` and ``nonce``).
``complete`` takes the callback's parameters and the browser cookie, exchanges
the code, verifies the ID token's signature and claims, and maps the groups to a
console role, raising a :class:`SignOnRefused` subclass at the first problem.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from base64 import urlsafe_b64encode
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

from pydantic import SecretStr

from appliance.errors import ConfigError
from appliance.settings import Settings
from appliance.sso.claims import Expected, check_claims, groups_from, role_for, username_from
from appliance.sso.idtoken import verified_claims
from appliance.sso.pending import PendingSignOns
from appliance.sso.provider import IdentityProvider
from appliance.sso.refusals import SignOnForbidden, SignOnRefused

COOKIE = "appliance_oidc"
COOKIE_PATH = "/login/oidc"
CALLBACK_PATH = "/login/oidc/callback"
_REMEMBERED_TOKENS = 10_000


@dataclass(frozen=True, slots=True)
class SsoConfig:
    """Single sign-on settings, with the client secret already read."""

    issuer: str
    client_id: str
    client_secret: SecretStr | None
    provider_name: str
    scopes: tuple[str, ...]
    username_claim: str
    groups_claim: str
    group_roles: Mapping[str, str]
    default_role: str | None
    public_url: str | None


def _read_secret(settings: Settings) -> SecretStr | None:
    if settings.oidc_client_secret is not None:
        return settings.oidc_client_secret
    path = settings.oidc_client_secret_file
    if path is None:
        return None
    path = path if path.is_absolute() else settings.data_dir / path
    try:
        value = Path(path).read_text().strip()
    except OSError:
        raise ConfigError("oidc_client_secret_file cannot be read") from None
    if not value:
        raise ConfigError("oidc_client_secret_file is empty")
    return SecretStr(value)


def sso_config(settings: Settings) -> SsoConfig | None:
    """The single sign-on configuration, or None when no provider is configured."""
    if not settings.oidc_issuer or not settings.oidc_client_id:  # both or neither (checked when settings load)
        return None
    scopes = ("openid", *[s for s in settings.oidc_scopes if s != "openid"])
    public = settings.console_public_url.rstrip("/") if settings.console_public_url else None
    return SsoConfig(
        issuer=settings.oidc_issuer,
        client_id=settings.oidc_client_id,
        client_secret=_read_secret(settings),
        provider_name=settings.oidc_provider_name,
        scopes=scopes,
        username_claim=settings.oidc_username_claim,
        groups_claim=settings.oidc_groups_claim,
        group_roles=dict(settings.oidc_group_roles),
        default_role=settings.oidc_default_role,
        public_url=public,
    )


@dataclass(frozen=True, slots=True)
class Identity:
    """A verified provider user, mapped to the console."""

    subject: str
    username: str
    role: str
    groups: tuple[str, ...]
    id_token: str
    next_url: str


@dataclass(frozen=True, slots=True)
class Redirect:
    url: str
    browser: str


def _challenge(verifier: str) -> str:
    return urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


class SingleSignOn:
    def __init__(
        self,
        config: SsoConfig,
        provider: IdentityProvider,
        pending: PendingSignOns | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.config = config
        self.provider = provider
        self._pending = pending or PendingSignOns()
        self._clock = clock
        self._id_tokens: OrderedDict[str, str] = OrderedDict()

    @classmethod
    def from_settings(cls, settings: Settings) -> SingleSignOn | None:
        config = sso_config(settings)
        if config is None:
            return None
        return cls(config, IdentityProvider(config.issuer, config.client_id, config.client_secret))

    def redirect_uri(self, request_base: str) -> str:
        """The callback URL registered at the provider: under ``console_public_url``, else the URL the browser used."""
        return (self.config.public_url or request_base.rstrip("/")) + CALLBACK_PATH

    def login_page_url(self, request_base: str) -> str:
        """Where the provider sends the browser after its logout."""
        return (self.config.public_url or request_base.rstrip("/")) + "/login"

    async def begin(self, redirect_uri: str, next_url: str) -> Redirect:
        meta = await self.provider.metadata()
        started = self._pending.begin(next_url)
        query = urlencode(
            {
                "response_type": "code",
                "client_id": self.config.client_id,
                "redirect_uri": redirect_uri,
                "scope": " ".join(self.config.scopes),
                "state": started.state,
                "nonce": started.pending.nonce,
                "code_challenge": _challenge(started.pending.code_verifier),
                "code_challenge_method": "S256",
            }
        )
        separator = "&" if "?" in meta.authorization_endpoint else "?"
        return Redirect(url=meta.authorization_endpoint + separator + query, browser=started.browser)

    async def complete(self, params: Mapping[str, str], browser: str | None, redirect_uri: str) -> Identity:
        if params.get("error"):
            with contextlib.suppress(SignOnRefused):  # the sign-in is over either way: its state is used up
                self._pending.take(params.get("state"), browser)
            error = "".join(c for c in params["error"] if c.isalnum() or c in "_-.")[:64]
            raise SignOnRefused(f"provider error {error}", f"The identity provider did not sign you in ({error}).")
        pending = self._pending.take(params.get("state"), browser)
        code = params.get("code")
        if not code or len(code) > 2048:
            raise SignOnRefused("callback without a code")
        id_token = await self.provider.exchange(code, pending.code_verifier, redirect_uri)
        claims = await verified_claims(id_token, self.provider.keys_for)
        meta = await self.provider.metadata()
        check_claims(
            claims, Expected(issuer=meta.issuer, client_id=self.config.client_id, nonce=pending.nonce, now=self._clock())
        )
        username = username_from(claims, self.config.username_claim)
        groups = groups_from(claims, self.config.groups_claim)
        role = role_for(groups, self.config.group_roles, self.config.default_role)
        if role is None:
            raise SignOnForbidden(
                f"no console role for {username}",
                "You signed in at the identity provider, but none of your groups gives access to this "
                "console. Ask an administrator to add you to a group that does.",
            )
        subject = f"{meta.issuer} {claims['sub']}"
        if len(subject) > 255:  # the column's size; a digest keeps long identities distinct
            subject = "sha256:" + hashlib.sha256(subject.encode()).hexdigest()
        return Identity(
            subject=subject, username=username, role=role, groups=tuple(groups), id_token=id_token, next_url=pending.next_url
        )

    def remember_id_token(self, session_id: str, id_token: str) -> None:
        """Kept in memory for the provider's logout (``id_token_hint``); a restart forgets it."""
        key = hashlib.sha256(session_id.encode()).hexdigest()
        self._id_tokens[key] = id_token
        while len(self._id_tokens) > _REMEMBERED_TOKENS:
            self._id_tokens.popitem(last=False)

    async def logout_url(self, session_id: str, post_logout_redirect_uri: str) -> str | None:
        """Where the browser goes to end the provider's session too, if the provider advertises it."""
        id_token = self._id_tokens.pop(hashlib.sha256(session_id.encode()).hexdigest(), None)
        try:
            endpoint = (await self.provider.metadata()).end_session_endpoint
        except SignOnRefused:
            return None
        if endpoint is None:
            return None
        query = {"client_id": self.config.client_id, "post_logout_redirect_uri": post_logout_redirect_uri}
        if id_token:
            query["id_token_hint"] = id_token
        return endpoint + ("&" if "?" in endpoint else "?") + urlencode(query)
