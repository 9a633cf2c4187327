"""Why a single sign-on did not succeed.

``message`` is shown to the person signing in; ``reason`` is the short,
secret-free text the audit log records (``console.sso_refused``). Neither ever
carries a token, a code or the client secret.
"""

from __future__ import annotations

from appliance.errors import ApplianceError


class SignOnRefused(ApplianceError):
    """The identity provider's answer cannot be trusted (signature, audience, expiry, nonce, ...)."""

    status = 401
    type = "authentication_error"
    code = "sso_refused"

    def __init__(
        self, reason: str, message: str = "Single sign-on failed: the identity provider's answer could not be verified."
    ):
        super().__init__(message)
        self.reason = reason


class SignOnStateRefused(SignOnRefused):
    """The callback's ``state`` is unknown, used before, expired or from another browser."""

    status = 400

    def __init__(self, reason: str):
        super().__init__(reason, "This sign-in link has expired or was already used. Start again from the sign-in page.")


class SignOnForbidden(SignOnRefused):
    """The identity is genuine, but may not use the console (no mapped group, name taken by a local account)."""

    status = 403

    def __init__(self, reason: str, message: str):
        super().__init__(reason, message)


class ProviderUnavailable(SignOnRefused):
    """The identity provider could not be reached or answered nonsense."""

    status = 424

    def __init__(self, reason: str):
        super().__init__(reason, "The identity provider is not reachable right now. Try again later, or ask an administrator.")
