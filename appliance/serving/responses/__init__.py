"""OpenAI's Responses API, served through the chat path of the gateway.

Lives here: ``translate`` (pure: a Responses request and its conversation to a
chat completion request, a chat completion to a Responses object), ``events``
(pure: a chat completion stream to Responses stream events), ``stored`` (the
responses kept for ``previous_response_id`` and ``GET /v1/responses/{id}``), and
``service`` (one request: translate, hand to the gateway, translate back, store).

May import the gateway, the OpenAI schema, the db tables and errors; never api.
"""
