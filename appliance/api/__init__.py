"""The HTTP API, the top layer: the edge in front of routing, the access guard, and every controller.

Lives here: ``edge`` (Host, canonical paths, body deadlines), ``http_protocol``
(header deadline), ``access`` (who may call a route), ``request`` (JSON depth
limit), ``errors`` (the one exception handler), and the controllers:
``openai`` (/v1), ``responses`` (/v1/responses), ``anthropic`` (/v1/messages), ``ollama`` (/api), ``admin``,
``models``, ``usage``, ``users``, ``cache``,
``planning``, ``metrics``, ``health``.

May import every package below it (serving, metering, cache, store, planner,
accounts, db, hardware). Nothing below imports from here.
"""
