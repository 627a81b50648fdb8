"""The HTTP-client layer never changes what the caller sees: a failure injected into each of its
own steps (deciding, opening the record, rewriting the request, watching the answer, reading it,
recording it, marking the failure) leaves every client's answer exactly as it is without
arttrace, with warnings turned into errors; the call is marked or not recorded, never trained."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

import pytest

import arttrace as at
from arttrace.capture import (
    _context,
    _guard,
    _http,
    _http_aiohttp,
    _http_httpx,
    _http_lm15,
    _http_requests,
    _http_stdlib,
    _sse,
    _warnings,
    _wire,
)
from arttrace.testing import LLMServer, ScriptedLLM
from support.common import warnings_are_errors
from support.http_clients import CLIENTS, MODES, USER, normal

Serve = Callable[[ScriptedLLM], LLMServer]


def boom(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("injected")


FAULTS: dict[str, list[tuple[Any, str]]] = {
    "passing": [(_context, "capturing")],  # the first check of every hook (boom has no .get)
    "deciding": [(_context, "recording")],
    "opening": [(_wire, "open_recorder")],
    "rewriting": [
        (_http_aiohttp, "_rewritten"),
        (_http_lm15, "_rewritten"),
        (_http_httpx, "sized_headers"),
        (_http_requests, "sized_headers"),
        (_http_stdlib, "sized_headers"),
    ],
    "watching": [
        (_http_httpx, "_tap"),
        (_http_aiohttp, "_tap"),
        (_http_lm15, "_watch"),
        (_http_requests, "_Raw"),
        (_http_stdlib, "_Response"),
    ],
    "answered": [(_http, "EventReader")],
    "reading": [(_sse.EventReader, "feed"), (_wire._ChatCall, "whole")],
    "recording": [(_wire._ChatCall, "event"), (_wire._ChatCall, "ended")],
    "marking": [(_wire._ChatCall, "whole"), (_wire._ChatCall, "event"), (_wire._ChatCall, "lost")],
}
REWRITES = {"rewriting"}
"""Faults on the way out: the caller does not ask for the training fields, so the layer would
add them; the request must go as the caller wrote it."""


async def caller(
    server: Serve, client: str, streamed: bool, asks: bool
) -> tuple[bytes, at.Trajectory]:
    body: dict[str, Any] = {"model": "policy", "messages": USER, "stream": streamed}
    if asks:  # the same request with and without arttrace
        body |= {"logprobs": True, "return_token_ids": True}
    url = server(ScriptedLLM()).base_url + "/chat/completions"

    @at.trainable
    async def agent() -> bytes:
        return await CLIENTS[client](url, body, streamed)

    async with at.trajectory("fault") as t:
        data = await agent()
    return data, t


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("client", CLIENTS)
async def test_a_fault_in_any_step_is_invisible_to_the_caller(
    server: Serve,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    client: str,
    mode: str,
    fault: str,
) -> None:
    asks = fault not in REWRITES
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain, _ = await caller(server, client, MODES[mode], asks)
    for owner, name in FAULTS[fault]:
        monkeypatch.setattr(owner, name, boom)
    monkeypatch.setattr(_guard, "_logged", set())
    at.instrument()
    try:
        with warnings_are_errors(), caplog.at_level(logging.ERROR, "arttrace"):
            seen, t = await caller(server, client, MODES[mode], asks)
    finally:
        at.uninstrument()
        _warnings.reset()
    assert normal(seen) == normal(plain)
    failed = [r for r in caplog.records if r.getMessage().startswith("arttrace failed")]
    if failed:  # the fault was on this client's path: nothing half-recorded is trained on
        assert t.trainable_turns == 0
        assert all(c.capture_error or c.partial for c in t.calls)  # partial: not even marked
    else:  # not on this path (a streamed-only step on a whole answer, ...)
        assert fault in ("watching", "answered", "recording") and t.trainable_turns == 1


def test_the_fault_points_exist() -> None:
    """A renamed internal would make a fault test pass vacuously."""
    for points in FAULTS.values():
        for owner, name in points:
            assert hasattr(owner, name), (owner, name)
