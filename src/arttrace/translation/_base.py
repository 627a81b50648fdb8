"""The contract between a protocol the agent speaks and the Chat Completions call arttrace
makes for it (opt-in): one :class:`Translation` per call.

The agent's request becomes a Chat Completions body (``upstream_body``), which the caller of
this module sends upstream, asking for token ids and logprobs and recording it as any Chat
Completions call, so every turn trains with exact tokens. The upstream's answer, whole or
streamed, comes back in the agent's protocol.

The translation itself holds no I/O: the gateway and the in-process HTTP layer each send the
upstream body their own way and feed what comes back through the same methods.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson


class TranslationError(ValueError):
    """The agent's request cannot be translated (a built-in tool, an unknown
    ``previous_response_id``, ...): answered to the agent as a 400 in its own protocol."""


class Translation(Protocol):
    """One call of an agent speaking another protocol, made as a Chat Completions call."""

    api: str
    """The agent's protocol: ``"responses"`` or ``"messages"``."""
    stream: bool
    """Whether the agent asked for a stream (the upstream call streams too)."""
    upstream_body: dict[str, Any]
    """The Chat Completions request to send (``stream_options.include_usage`` set when it
    streams). The caller adds the training fields (``logprobs``, ``return_token_ids``)."""

    def answer(self, chat: dict[str, Any]) -> dict[str, Any]:
        """The agent-protocol JSON body for the upstream's whole Chat Completion ``chat``."""
        ...

    def start(self) -> bytes:
        """The SSE bytes the agent gets before the first upstream chunk (may be empty)."""
        ...

    def chunk(self, chunk: dict[str, Any]) -> bytes:
        """The SSE bytes (zero or more whole events) for one upstream ``ChatCompletionChunk``."""
        ...

    def end(self) -> bytes:
        """The closing SSE bytes, once the upstream stream has ended."""
        ...

    def error(self, status: int, body: bytes) -> bytes:
        """The agent-protocol JSON error body for an upstream error ``status`` / ``body`` (or,
        mid-stream, the bytes of the protocol's error event: ``stream`` says which)."""
        ...


def upstream_error(status: int, body: bytes) -> tuple[str, str, str | int]:
    """The message, type and code of an upstream error body: OpenAI's shape (which vLLM
    sends), vLLM's older bare ``message``, FastAPI's ``detail``; anything else quoted."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            kind = str(error.get("type") or "server_error")
            return error["message"], kind, error.get("code") or status
        for key in ("message", "detail"):
            if isinstance(parsed.get(key), str) and parsed[key]:
                return parsed[key], str(parsed.get("type") or "server_error"), status
        if isinstance(error, str) and error:
            return error, "server_error", status
    text = body[:500].decode("utf-8", "replace")
    return f"the upstream answered {status}: {text}", "server_error", status
