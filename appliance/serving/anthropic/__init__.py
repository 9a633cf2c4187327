"""The Anthropic Messages API as a translation over the chat-completions path.

``request`` turns a :class:`~appliance.serving.anthropic.schema.MessagesRequest` into the
:class:`~appliance.openai_schema.ChatCompletionRequest` the gateway serves (so a
message is authenticated, admitted, cached, routed and metered like any chat
completion); ``response`` turns the chat answer back into a message; ``stream``
translates the gateway's chat SSE stream into Anthropic's events, one event at a
time. All three are pure: no I/O, no collaborators.

May import appliance.openai_schema, appliance.errors
and appliance.jsontypes only.
"""
