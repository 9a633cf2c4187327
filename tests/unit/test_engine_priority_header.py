"""The gateway tells the engine each request's priority class in one header, and no header can smuggle a second."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from appliance.drivers.llamacpp.latency import priority_of
from appliance.serving.engine_client import PRIORITY_HEADER, EngineClient
from tests.unit.test_engine_client import ScriptedEngine, sized


async def answer(request: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    writer.write(sized(b"{}"))
    await writer.drain()
    return True


async def test_the_priority_header_goes_with_that_request_only(tmp_path: Path):
    path = tmp_path / "e.sock"
    async with ScriptedEngine(path, answer) as engine:
        client = EngineClient(path)
        r = await client.request("POST", "/v1/completions", b"{}", headers={PRIORITY_HEADER: "batch"})
        await r.read()
        r = await client.request("POST", "/v1/completions", b"{}")
        await r.read()
        await client.aclose()
    first, second = (req.split(b"\r\n\r\n", 1)[0].split(b"\r\n") for req in engine.requests)
    assert b"x-appliance-priority: batch" in first
    assert not any(line.lower().startswith(b"x-appliance-priority") for line in second)
    # the worker reads it back from the ASGI scope as uvicorn hands it over (lower-case names, bytes)
    headers = [tuple(line.lower().split(b": ", 1)) for line in first[1:]]
    assert priority_of({"headers": headers}) == "batch"


@pytest.mark.parametrize(
    "headers",
    [{PRIORITY_HEADER: "batch\r\nx-evil: 1"}, {PRIORITY_HEADER: "batch\n"}, {"x-a: b": "c"}, {"x-a\r\nx-b": "c"}],
)
async def test_a_header_cannot_carry_another(tmp_path: Path, headers: dict[str, str]):
    path = tmp_path / "e.sock"
    async with ScriptedEngine(path, answer) as engine:
        client = EngineClient(path)
        with pytest.raises(ValueError):
            await client.request("POST", "/v1/completions", b"{}", headers=headers)
        await client.aclose()
    assert engine.requests == []
