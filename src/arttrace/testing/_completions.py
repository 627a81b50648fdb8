"""The scripted model behind the legacy ``/v1/completions``, answering as vLLM does.

Each prompt (a string, or a list of strings) is answered by the
:class:`~arttrace.testing.ScriptedLLM` as a user message, and returned as text choices:
``logprobs`` (``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``) when the request
asks for them (an integer: how many alternatives), and, with ``return_token_ids``, vLLM's
per-choice ``prompt_token_ids`` and ``token_ids``. A stream sends one chunk per token (the
first of each choice carries its ``prompt_token_ids``), a usage chunk when
``stream_options.include_usage`` asks for it, then ``data: [DONE]``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from ._llm import Answer, Endpoint, ScriptedLLM


class CompletionsAPI(Endpoint):
    """``/v1/completions`` over a :class:`~arttrace.testing.ScriptedLLM`."""

    def __init__(self, llm: ScriptedLLM) -> None:
        super().__init__()
        self.llm = llm

    def respond(self, body: dict[str, Any]) -> Answer:
        number = self._received(body)
        prompts = body.get("prompt")
        prompts = [prompts] if isinstance(prompts, str) else prompts
        if not body.get("model") or not isinstance(prompts, list) or not prompts:
            return 400, {"error": {"message": "model and prompt are required"}}, None
        n = int(body.get("n") or 1)
        head = {
            "id": f"cmpl-{number}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body["model"],
        }
        answers = []
        for k, prompt in enumerate(prompts):
            chat = {
                "model": body["model"],
                "messages": [{"role": "user", "content": str(prompt)}],
                "n": n,
                "logprobs": True,
                "top_logprobs": int(body.get("logprobs") or 0),
                "return_token_ids": True,
            }
            status, payload, _ = self.llm.respond(chat)
            if status != 200 or payload is None:
                return status, payload, None
            answers.append((k, self._prompt_ids(str(prompt), payload), payload))
        choices = [
            self._choice(body, k * n + c["index"], prompt_ids, c)
            for k, prompt_ids, payload in answers
            for c in payload["choices"]
        ]
        prompt_tokens = sum(len(p) for _, p, _ in answers)
        if body.get("stream"):
            return 200, None, self._stream(body, head, choices, prompt_tokens)
        completion_tokens = sum(len(c.pop("_ids")) for c in choices)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        for c in choices:
            c.pop("_entries")
        return 200, {**head, "choices": choices, "usage": usage}, None

    def _prompt_ids(self, prompt: str, payload: dict[str, Any]) -> list[int]:
        """The prompt's own ids (no chat template), when the tokenizer can encode text."""
        encode = getattr(self.llm.tokenizer, "encode", None)
        ids = encode(prompt) if encode is not None else payload.get("prompt_token_ids")
        return list(ids or ())

    def _choice(
        self, body: dict[str, Any], index: int, prompt_ids: list[int], chat: dict[str, Any]
    ) -> dict[str, Any]:
        entries = (chat.get("logprobs") or {}).get("content") or []
        ids = list(chat.get("token_ids") or ())
        text = chat["message"].get("content") or ""
        want_ids = bool(body.get("return_token_ids")) and self.llm.token_ids
        wanted = body.get("logprobs") is not None and self.llm.logprobs
        return {
            "index": index,
            "text": text,
            "logprobs": _logprobs(entries, 0) if wanted else None,
            "finish_reason": chat.get("finish_reason"),
            "stop_reason": None,
            "prompt_logprobs": None,
            "token_ids": ids if want_ids else None,
            "prompt_token_ids": prompt_ids if want_ids else None,
            "_ids": ids,
            "_entries": entries if wanted else None,
        }

    def _stream(
        self,
        body: dict[str, Any],
        head: dict[str, Any],
        choices: list[dict[str, Any]],
        prompt_tokens: int,
    ) -> Iterator[bytes]:
        """One chunk per token; the text spread over the tokens as the tokenizer gives it."""
        text_of = self.llm.tokenizer.text
        total = 0
        for choice in choices:
            ids, entries = choice.pop("_ids"), choice.pop("_entries")
            total += len(ids)
            pieces = [text_of(i) for i in ids]
            if "".join(pieces[:-1]) != choice["text"]:  # not exact: all text on the first
                pieces = [choice["text"]] + [""] * (len(ids) - 1)
            offset = 0
            for pos, token_id in enumerate(ids):
                text = pieces[pos] if pos < len(ids) - 1 else ""
                part: dict[str, Any] = {
                    "index": choice["index"],
                    "text": text,
                    "logprobs": _logprobs(entries[pos : pos + 1], offset) if entries else None,
                    "finish_reason": choice["finish_reason"] if pos == len(ids) - 1 else None,
                    "stop_reason": None,
                }
                if choice["token_ids"] is not None:
                    part["token_ids"] = [token_id]
                    if pos == 0:
                        part["prompt_token_ids"] = choice["prompt_token_ids"]
                offset += len(text)
                yield _data({**head, "choices": [part]})
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": total,
                "total_tokens": prompt_tokens + total,
            }
            yield _data({**head, "choices": [], "usage": usage})
        yield b"data: [DONE]\n\n"


def _logprobs(entries: list[dict[str, Any]], offset: int) -> dict[str, Any]:
    """Chat logprob entries in the Completions form."""
    offsets, tokens = [], []
    for entry in entries:
        offsets.append(offset)
        tokens.append(entry["token"])
        offset += len(bytes(entry.get("bytes") or ()).decode("utf-8", "replace"))
    return {
        "text_offset": offsets,
        "token_logprobs": [e["logprob"] for e in entries],
        "tokens": tokens,
        "top_logprobs": [
            {t["token"]: t["logprob"] for t in e.get("top_logprobs") or ()} or None for e in entries
        ],
    }


def _data(chunk: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(chunk)}\n\n".encode()
