"""The request path: the gateway (admit, cache, route, forward, settle), model routing, admission queues, engine processes.

May import metering, cache, store, planner, accounts, db, hardware and drivers; never api.
"""
