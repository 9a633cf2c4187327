"""The llama.cpp engine: the driver the daemon starts (``driver``) and the worker process it runs
(``worker``: the HTTP protocol, the continuous-batching ``batcher`` with its decode ``context``,
``sequence`` state, prefill ``scheduling``, ``token_sampler`` and ``speculation``; sampler chains,
grammars, chat templates, text streams and embeddings), over llama-cpp-python's low-level API.

The worker runs in its own process and imports nothing of the daemon's packages but its error
tree (``appliance.errors``) and JSON names (``appliance.jsontypes``).
"""
