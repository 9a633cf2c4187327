"""The response cache: exact and semantic tiers (``responses``), cache keys and sharing rules (``keys``),
stream folding and replay (``replay``), the nearest-prompt search (``semantic``) and the embedding model (``embedder``).

May import accounts and db; never serving or api.
"""
