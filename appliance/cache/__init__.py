"""The response cache: the facade the gateway and the admin API call (``responses``), cache keys and sharing rules
(``keys``), policies (``policies``), the hot LRU and exact reads (``exact``), the rows in SQLite (``entries``), the
writer thread (``writer``), the counters behind the stats (``counters``), the semantic tier's embedding thread
(``semantic_tier``), the nearest-prompt search (``semantic``) and its lexical check (``lexical``, reading units of
measure with ``measures`` and opposite words with ``opposites``), the embedding model (``embedder``), and stream folding
and replay (``replay``).

May import accounts and db; never serving or api.
"""
