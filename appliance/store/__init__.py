"""The model store: installed variants on disk and in the database (``store``), checked names and paths
(``paths``), local imports (``imports``), SSRF-checked resumable pulls (``pull``), quantization,
the default model and the background jobs that run the long work.

May import modelfacts, catalog, db; never serving or api.
"""
