"""HTTPS served by the daemon itself: certificates, their checks, the live TLS context.

- :mod:`appliance.tls.mode`: which TLS mode a settings object asks for (``auto`` resolved) and
  the names and addresses a self-signed certificate must carry.
- :mod:`appliance.tls.generate`: the box's own CA and server certificate, made once into the
  data dir (keys 0600) and renewed when they no longer cover the box's names or near expiry.
- :mod:`appliance.tls.certinfo`: what one certificate says (fingerprint, expiry, names).
- :mod:`appliance.tls.validate`: checks of an admin's certificate and key files before use.
- :mod:`appliance.tls.context`: the one ``ssl.SSLContext`` of the listener and its reload.
- :mod:`appliance.tls.hsts`: the Strict-Transport-Security header on every https response.
- :mod:`appliance.tls.redirect`: the optional plain-HTTP port that only answers 301 to https.
- :mod:`appliance.tls.expiry`: the alert raised when the served certificate nears its expiry.

May import :mod:`appliance.settings`, :mod:`appliance.errors`, ``cryptography``, and (for the expiry
alert) :mod:`appliance.db` and the webhook signing of :mod:`appliance.metering.alerts`; nothing from
the API, serving or console packages.
"""
