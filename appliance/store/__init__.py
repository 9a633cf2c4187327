"""The model store: installed variants on disk and in the database.

``store`` (``ModelStore``: checks requests, runs pulls, imports, quantizations, verification and deletes),
``sources`` (what a pull or an import names: URL, sha256, format, family:variant), ``refusals`` (what a read-only
store, an offline appliance or a variant without files refuses), ``registry`` (the variants' rows), ``installs`` (the
one install path from files), ``variants`` (what the store reports), ``paths`` (checked names and paths), ``imports``
(local file policy and hashing), ``integrity`` (a variant's size and sha256 on disk), ``pull`` (the SSRF checks of a
pull), ``download`` (the resumable download), ``hub/`` (pulls from a Hugging Face hub or mirror), ``split_gguf`` (GGUF
models in parts), ``bundles`` (offline bundles: export and verified import) and ``bundle_import`` (installing one),
``readonly`` (registering the models of a read-only store), ``disk`` (free space), ``quantize``, ``default_model``,
``jobs`` (the background jobs that run the long work) and ``errors``.

Imports run one way: ``store`` → ``bundle_import`` → ``installs`` → ``registry`` → ``variants``; ``store`` →
``sources``, ``refusals``, ``integrity``; ``default_model`` → ``store``.
May import modelfacts, catalog, db; never serving or api.
"""
