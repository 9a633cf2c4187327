"""A stand-in engine for measuring the gateway alone: answers every completion at once.

It speaks the same internal protocol as the real engines (OpenAI-shaped HTTP on
a Unix socket), so the gateway, supervisor, metering and cache run unchanged,
and the time it adds is close to zero. A request with ``"stream": true`` gets
``max_tokens`` events (one token each), then the usage event and ``[DONE]``,
all as fast as the socket takes them. With ``--tcp-port`` it also listens on
127.0.0.1, so a load generator that cannot speak to a Unix socket can measure
the engine alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json

import uvicorn

BODY = json.dumps(
    {
        "id": "chatcmpl-echo",
        "object": "chat.completion",
        "created": 0,
        "model": "echo",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop", "logprobs": None}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6, "prompt_tokens_details": {"cached_tokens": 0}},
    }
).encode()
TOKEN_EVENT = (
    b'data: {"id":"chatcmpl-echo","object":"chat.completion.chunk","created":0,"model":"echo",'
    b'"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":null,"logprobs":null}]}\n\n'
)


def usage_event(tokens: int) -> bytes:
    usage = {
        "prompt_tokens": 5,
        "completion_tokens": tokens,
        "total_tokens": 5 + tokens,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    return (
        b"data: "
        + json.dumps(
            {
                "id": "chatcmpl-echo",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "echo",
                "choices": [],
                "usage": usage,
            }
        ).encode()
        + b"\n\n"
    )


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    if scope["path"] == "/health":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"status":"ok"}'})
        return
    request = json.loads(body) if body else {}
    if not request.get("stream"):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": BODY})
        return
    tokens = int(request.get("max_tokens") or 16)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    for _ in range(tokens):  # one event a message, as an engine sends them
        await send({"type": "http.response.body", "body": TOKEN_EVENT, "more_body": True})
    await send({"type": "http.response.body", "body": usage_event(tokens) + b"data: [DONE]\n\n"})


async def serve(socket: str, tcp_port: int | None) -> None:
    common = dict(log_level="warning", access_log=False, http="httptools", lifespan="off")
    servers = [uvicorn.Server(uvicorn.Config(app, uds=socket, **common))]
    if tcp_port:
        servers.append(uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=tcp_port, **common)))
    await asyncio.gather(*(server.serve() for server in servers))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--tcp-port", type=int, default=None)
    args = parser.parse_args()
    import uvloop

    uvloop.run(serve(args.socket, args.tcp_port))
