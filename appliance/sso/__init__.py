"""Single sign-on to the console with OpenID Connect (authorization code flow with PKCE).

- ``refusals``: the typed errors of a sign-in that must not succeed, each with the
  reason the audit log records.
- ``claims``: pure checks of an ID token's claims (issuer, audience, times, nonce)
  and the mapping of the provider's groups to a console role.
- ``idtoken``: the ID token's signature, checked against the provider's keys.
- ``provider``: the identity provider over HTTP (discovery, keys, token exchange),
  with its metadata and keys cached.
- ``pending``: sign-ins under way: single-use ``state`` bound to the browser.
- ``signon``: the flow from the sign-in button to a verified identity.
- ``users``: console users created and updated from a verified identity.

May import ``appliance.errors``, ``appliance.jsontypes``, ``appliance.db`` and ``appliance.settings``; the
console's routes (``appliance.webui.routes_sso``) import this package, never the reverse.
"""
