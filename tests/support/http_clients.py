"""Every HTTP client the HTTP-client layer hooks, each sending one Chat Completions request
(whole or streamed) and returning the bytes its caller reads."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import httpx
import requests
from dspy._vendor.lm15.transports import (
    StdlibAsyncTransport,
    StdlibTransport,
    TransportRequest,
)

from arttrace.testing import LLMServer, ScriptedLLM

Serve = Callable[[ScriptedLLM], LLMServer]
Call = Callable[[str, dict[str, Any], bool], Awaitable[bytes]]
USER = [{"role": "user", "content": "add 1 and 2"}]
JSON = {"content-type": "application/json"}


# -- one POST per client, returning the bytes the caller read -----------------------------


async def httpx_sync(url: str, body: dict[str, Any], stream: bool) -> bytes:
    with httpx.Client() as client:
        if not stream:
            return client.post(url, json=body).content
        with client.stream("POST", url, json=body) as response:
            return b"".join(response.iter_bytes())


async def httpx_async(url: str, body: dict[str, Any], stream: bool) -> bytes:
    async with httpx.AsyncClient() as client:
        if not stream:
            return (await client.post(url, json=body)).content
        async with client.stream("POST", url, json=body) as response:
            return b"".join([piece async for piece in response.aiter_bytes()])


async def aiohttp_json(url: str, body: dict[str, Any], stream: bool) -> bytes:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        if not stream:
            return await response.read()
        return b"".join([line async for line in response.content])


async def aiohttp_data(url: str, body: dict[str, Any], stream: bool) -> bytes:
    data = json.dumps(body)
    headers = {**JSON, "Content-Length": str(len(data))}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=data, headers=headers) as response,
    ):
        if not stream:
            return await response.read()
        return b"".join([piece async for piece in response.content.iter_any()])


async def requests_call(url: str, body: dict[str, Any], stream: bool) -> bytes:
    if not stream:
        return requests.post(url, json=body, timeout=10).content
    with requests.post(url, json=body, stream=True, timeout=10) as response:
        return b"".join(response.iter_content(chunk_size=None))


async def urllib_call(url: str, body: dict[str, Any], stream: bool) -> bytes:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=JSON)
    with urllib.request.urlopen(request, timeout=10) as response:
        return b"".join(response) if stream else response.read()


def lm15_request(url: str, body: dict[str, Any]) -> TransportRequest:
    data = json.dumps(body).encode()
    headers = [("content-type", "application/json"), ("content-length", str(len(data)))]
    return TransportRequest("POST", url, headers=headers, body=data)


async def lm15_sync(url: str, body: dict[str, Any], stream: bool) -> bytes:
    """DSPy's default engine's transport (lm15's, on bare sockets), as its providers use it."""
    with StdlibTransport() as transport, transport.stream(lm15_request(url, body)) as response:
        return b"".join(response.iter_lines()) if stream else response.read()


async def lm15_async(url: str, body: dict[str, Any], stream: bool) -> bytes:
    transport = StdlibAsyncTransport()
    try:
        async with transport.stream(lm15_request(url, body)) as response:
            if not stream:
                return await response.read()
            return b"".join([line async for line in response.aiter_lines()])
    finally:
        await transport.aclose()


CLIENTS: dict[str, Call] = {
    "httpx": httpx_sync,
    "httpx-async": httpx_async,
    "aiohttp-json": aiohttp_json,
    "aiohttp-data": aiohttp_data,
    "requests": requests_call,
    "urllib": urllib_call,
    "dspy-lm15": lm15_sync,
    "dspy-lm15-async": lm15_async,
}
MODES = {"whole": False, "streamed": True}


def normal(data: bytes) -> bytes:
    """``data`` without the ``created`` clock (two arms may straddle a second)."""
    return re.sub(rb'"created": \d+', b'"created": 0', data)
