"""Pulls from a Hugging Face hub (or a mirror speaking its HTTP API): ``hf:ORG/REPO[:QUANT|/FILE][@REVISION]``.

``spec`` (the parsed pull spec), ``listing`` (a repository's files as the hub lists them, checked, and the
variants they make: single GGUF files, split GGUF sets, one safetensors folder), ``client`` (requests to the hub:
the SSRF checks of :mod:`appliance.store.pull`, the token sent to the hub's own origin only), ``credentials``
(the token, read from its file and never shown) and ``pulls`` (choosing the variant and installing it through
:class:`appliance.store.installs.Installer`).

May import the rest of ``appliance.store`` except ``store``, and modelfacts; never serving, api or planner
(the planner's choice is handed in as a function).
"""
