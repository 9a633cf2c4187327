"""The Ollama API (/api/*) as the gateway serves it: request bodies (``schema``), the pure
translation of its requests to the internal OpenAI-shaped ones (``to_openai``), of the engine's
answers back to Ollama's objects (``answers``) and of its SSE events to Ollama's NDJSON stream
(``streams``), and the model listings (``views``).

May import ``appliance.openai_schema``, ``appliance.errors`` and ``appliance.jsontypes``;
no I/O happens here.
"""
