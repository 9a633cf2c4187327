"""The Ollama API (/api/*) as the gateway serves it: request bodies (``schema``), the pure
translation to and from the internal OpenAI-shaped requests and answers, streams included
(``translate``), and the model listings (``views``).

May import ``appliance.openai_schema``, ``appliance.errors`` and ``appliance.jsontypes``;
no I/O happens here.
"""
