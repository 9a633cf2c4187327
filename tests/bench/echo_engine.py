"""A stand-in engine for measuring the gateway alone: answers every completion at once.

It speaks the same internal protocol as the real engines (OpenAI-shaped HTTP on
a Unix socket), so the gateway, supervisor, metering and cache run unchanged,
and the time it adds is close to zero.
"""

from __future__ import annotations

import argparse
import json

import uvicorn

BODY = json.dumps({
    "id": "chatcmpl-echo", "object": "chat.completion", "created": 0, "model": "echo",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop", "logprobs": None}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6, "prompt_tokens_details": {"cached_tokens": 0}},
}).encode()


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    body = b'{"status":"ok"}' if scope["path"] == "/health" else BODY
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    args = parser.parse_args()
    uvicorn.run(app, uds=args.socket, log_level="warning", access_log=False, http="httptools", loop="uvloop")
