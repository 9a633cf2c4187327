"""Who calls: API keys and principals (``keys``), console users and their password policy (``users``).

May import db and the top-level cross-cutting modules only.
"""
