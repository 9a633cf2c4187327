"""The request path: the gateway (admit, cache, route, forward, settle), model routing, admission queues, engine processes,
and the events each model load publishes (``load_events``).

``anthropic/`` translates the Anthropic Messages API to and from chat completions (pure functions).

May import metering, cache, store, planner, accounts, db, hardware and drivers; never api.
"""
