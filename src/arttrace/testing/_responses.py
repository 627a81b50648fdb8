"""The scripted model behind ``/v1/responses``, answering as vLLM's Responses API does.

A request's input items become the chat conversation vLLM renders (``instructions`` as the
system message; with ``previous_response_id``, the stored turn's messages and output first,
as vLLM does when its store is on), the :class:`~arttrace.testing.ScriptedLLM` answers it, and
its answer is returned in Responses form:

* whole: the output items (``reasoning``, a ``message`` with one ``output_text``, then one
  ``function_call`` per tool call), ``status`` (``incomplete`` after a length limit), usage;
* streamed: vLLM's named SSE events (``event: <type>`` / ``data: <json>``, no ``[DONE]``):
  ``response.created``, ``response.in_progress``, per item ``output_item.added`` /
  ``content_part.added`` / ``*.delta`` / ``*.done`` / ``output_item.done`` (held-back tokens
  send nothing), then ``response.completed`` carrying the whole response.

What carries exact ids, as in vLLM: with ``include: ["message.output_text.logprobs"]`` the
message's ``output_text`` holds the logprobs of the *whole* generation (tool-call tokens
included; a turn that is only a function call has no text to hold them, so none are sent);
with ``enable_response_messages: true``, ``input_messages`` / ``output_messages`` hold the
prompt and sampled ids (``raw_message_tokens``). With ``token_generations=True`` the server
plays a patched runtime that returns ART's ``token_generations`` carrier instead.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..capture._responses import LOGPROBS_INCLUDE, RESPONSE_MESSAGES, chat_tools, input_messages
from ._llm import Answer, Endpoint, ScriptedLLM


@dataclass
class _Generation:
    """One sampled turn, as the chat answer gave it (whole, or gathered from the stream)."""

    prompt: list[int] | None = None
    ids: list[int] | None = None
    entries: list[dict[str, Any]] | None = None
    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None


class ResponsesAPI(Endpoint):
    """``/v1/responses`` over a :class:`~arttrace.testing.ScriptedLLM` (see the module doc).

    ``token_generations``: return ART's ``token_generations`` carrier (a patched server)
    instead of vLLM's raw messages. ``requests``: every Responses body received; ``sent``:
    every whole response returned (a stream's is its ``response.completed``'s).
    """

    def __init__(self, llm: ScriptedLLM, *, token_generations: bool = False) -> None:
        super().__init__()
        self.llm = llm
        self.token_generations = token_generations
        self.sent: list[dict[str, Any]] = []
        self._store: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {}

    def respond(self, body: dict[str, Any]) -> Answer:
        """``(status, json_body, None)``, or ``(200, None, sse_chunks)`` for a stream."""
        number = self._received(body)
        if not body.get("model") or "input" not in body:
            return _error(400, "model and input are required", "input")
        previous = body.get("previous_response_id")
        with self._lock:
            stored = self._store.get(previous) if previous else None
        if previous and stored is None:
            return _error(404, f"Response with id '{previous}' not found.", "response_id")
        messages = self._messages(body, stored)
        chat: dict[str, Any] = {
            "model": body["model"],
            "messages": messages,
            "logprobs": True,
            "top_logprobs": int(body.get("top_logprobs") or 0),
            "return_token_ids": True,
        }
        if body.get("tools"):
            chat["tools"] = chat_tools(body["tools"])
        if body.get("stream"):
            chat["stream"], chat["stream_options"] = True, {"include_usage": True}
        status, payload, chunks = self.llm.respond(chat)
        turn = _Turn(self, body, messages, f"resp_{number:08x}")
        if chunks is not None:
            return 200, None, turn.stream(chunks)
        if status != 200 or payload is None:
            return status, payload, None
        return 200, turn.finish(_whole(payload)), None

    def _messages(
        self, body: dict[str, Any], stored: tuple[list[dict[str, Any]], dict[str, Any]] | None
    ) -> list[dict[str, Any]]:
        instructions = body.get("instructions")
        messages = [{"role": "system", "content": instructions}] if instructions else []
        if stored is not None:
            history, output = stored
            messages += [m for m in history if m.get("role") != "system"] + [output]
        return messages + input_messages(body["input"])

    def _keep(self, response_id: str, messages: list[dict[str, Any]], said: dict[str, Any]) -> None:
        with self._lock:
            self._store[response_id] = (messages, said)


class _Turn:
    """One request's answer in Responses form."""

    def __init__(
        self, api: ResponsesAPI, body: dict[str, Any], messages: list[dict[str, Any]], rid: str
    ) -> None:
        self.api, self.body, self.messages, self.id = api, body, messages, rid
        self.created = int(time.time())
        self.logprobs = LOGPROBS_INCLUDE in (body.get("include") or ())
        self.raw = bool(body.get(RESPONSE_MESSAGES))
        self.items = itertools.count()

    def finish(self, gen: _Generation) -> dict[str, Any]:
        """The whole response (the body of a whole answer, and of ``response.completed``)."""
        output = self._output(gen)
        said: dict[str, Any] = {"role": "assistant", "content": gen.content or None}
        if gen.tool_calls:
            said["tool_calls"] = gen.tool_calls
        self.api._keep(self.id, self.messages, said)
        response = self._response("completed", output, gen)
        if gen.finish_reason == "length":
            response["status"] = "incomplete"
            response["incomplete_details"] = {"reason": "max_output_tokens"}
        with self.api._lock:
            self.api.sent.append(response)
        return response

    def _output(self, gen: _Generation) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        if gen.reasoning:
            items.append(_reasoning_item(self._item_id("rs"), gen.reasoning, "completed"))
        if gen.content:
            logprobs = gen.entries if self.logprobs and self.api.llm.logprobs else None
            items.append(_message_item(self._item_id("msg"), gen.content, logprobs, "completed"))
        items += [_call_item(self._item_id("fc"), tc, "completed") for tc in gen.tool_calls]
        return items

    def _item_id(self, prefix: str) -> str:
        return f"{prefix}_{self.id[5:]}{next(self.items):02d}"

    def _response(
        self, status: str, output: list[dict[str, Any]], gen: _Generation | None
    ) -> dict[str, Any]:
        body = self.body
        response: dict[str, Any] = {
            "id": self.id,
            "created_at": self.created,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "metadata": body.get("metadata"),
            "model": body["model"],
            "object": "response",
            "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "temperature": body.get("temperature", 1.0),
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "top_p": body.get("top_p", 1.0),
            "background": False,
            "max_output_tokens": body.get("max_output_tokens") or 4096,
            "max_tool_calls": None,
            "previous_response_id": body.get("previous_response_id"),
            "prompt": None,
            "reasoning": body.get("reasoning"),
            "service_tier": "auto",
            "status": status,
            "text": body.get("text"),
            "top_logprobs": int(body.get("top_logprobs") or 0) if self.logprobs else None,
            "truncation": "disabled",
            "usage": None,
            "user": None,
            "input_messages": None,
            "output_messages": None,
        }
        if gen is None:
            return response
        prompt, ids = gen.prompt or [], gen.ids or []
        response["usage"] = {
            "input_tokens": len(prompt),
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": len(ids),
            "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0},
            "total_tokens": len(prompt) + len(ids),
        }
        if gen.prompt is None or gen.ids is None:  # the scripted server plays one without ids
            return response
        if self.api.token_generations:
            generation: dict[str, Any] = {
                "prompt_token_ids": prompt,
                "output_indices": list(range(len(output))),
                "token_ids": ids,
            }
            if gen.entries is not None:
                generation["output_tokens"] = [
                    {"token_id": i, "logprob": e["logprob"]}
                    for i, e in zip(ids, gen.entries, strict=True)
                ]
            response["token_generations"] = [generation]
        elif self.raw:
            text = self.api.llm.tokenizer.text
            response["input_messages"] = [_raw("".join(map(text, prompt)), prompt)]
            response["output_messages"] = [_raw("".join(map(text, ids)), ids)]
        return response

    # -- streaming -------------------------------------------------------------------------

    def stream(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        """vLLM's event stream for the chat stream ``chunks`` (cut where they are cut)."""
        seq = itertools.count()
        gen = _Generation(ids=[], entries=[])
        open_item: dict[str, Any] | None = None
        index = -1

        def send(kind: str, **fields: Any) -> bytes:
            event = {"type": kind, "sequence_number": next(seq), **fields}
            return f"event: {kind}\ndata: {json.dumps(event)}\n\n".encode()

        def close() -> Iterator[bytes]:
            nonlocal open_item
            item, open_item = open_item, None
            if item is None:
                return
            where = {"item_id": item["id"], "output_index": index}
            if item["type"] == "message":
                text = item["text"]
                yield send(
                    "response.output_text.done", **where, content_index=0, text=text, logprobs=[]
                )
                part = {"type": "output_text", "text": text, "annotations": []}
                yield send("response.content_part.done", **where, content_index=0, part=part)
                done = _message_item(item["id"], text, None, "completed")
            elif item["type"] == "reasoning":
                text = item["text"]
                yield send("response.reasoning_text.done", **where, content_index=0, text=text)
                part = {"type": "reasoning_text", "text": text}
                yield send("response.content_part.done", **where, content_index=0, part=part)
                done = _reasoning_item(item["id"], text, "completed")
            else:
                arguments = item["call"]["function"]["arguments"]
                yield send("response.function_call_arguments.done", **where, arguments=arguments)
                done = _call_item(item["id"], item["call"], "completed")
            yield send("response.output_item.done", output_index=index, item=done)

        def opened(kind: str, prefix: str, **extra: Any) -> Iterator[bytes]:
            nonlocal open_item, index
            yield from close()
            index += 1
            open_item = {"type": kind, "id": self._item_id(prefix), "text": "", **extra}
            where = {"output_index": index, "item_id": open_item["id"]}
            if kind == "message":
                item = _message_item(open_item["id"], "", None, "in_progress")
                item["content"] = []
                yield send("response.output_item.added", output_index=index, item=item)
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                yield send("response.content_part.added", **where, content_index=0, part=part)
            elif kind == "reasoning":
                item = {
                    "type": "reasoning",
                    "id": open_item["id"],
                    "summary": [],
                    "status": "in_progress",
                }
                yield send("response.output_item.added", output_index=index, item=item)
                part = {"type": "reasoning_text", "text": ""}
                yield send("response.content_part.added", **where, content_index=0, part=part)
            else:
                item = _call_item(open_item["id"], open_item["call"], "in_progress")
                yield send("response.output_item.added", output_index=index, item=item)

        initial = self._response("in_progress", [], None)
        yield send("response.created", response=initial)
        yield send("response.in_progress", response=initial)
        for chunk in _sse(chunks):
            if "prompt_token_ids" in chunk and gen.prompt is None:
                gen.prompt = chunk["prompt_token_ids"]
            if chunk.get("usage"):
                gen.usage = chunk["usage"]
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                entries = (choice.get("logprobs") or {}).get("content") or []
                assert gen.ids is not None and gen.entries is not None
                gen.ids += choice.get("token_ids") or ()
                gen.entries += entries
                gen.finish_reason = choice.get("finish_reason") or gen.finish_reason
                reasoning = delta.get("reasoning") or delta.get("reasoning_content")
                if reasoning:
                    if open_item is None or open_item["type"] != "reasoning":
                        yield from opened("reasoning", "rs")
                    assert open_item is not None
                    open_item["text"] += reasoning
                    gen.reasoning += reasoning
                    where = {"item_id": open_item["id"], "output_index": index, "content_index": 0}
                    yield send("response.reasoning_text.delta", **where, delta=reasoning)
                if delta.get("content"):
                    if open_item is None or open_item["type"] != "message":
                        yield from opened("message", "msg")
                    assert open_item is not None
                    open_item["text"] += delta["content"]
                    gen.content += delta["content"]
                    sent = [_stream_logprob(e) for e in entries] if self.logprobs else []
                    where = {"item_id": open_item["id"], "output_index": index, "content_index": 0}
                    yield send(
                        "response.output_text.delta", **where, delta=delta["content"], logprobs=sent
                    )
                for tc in delta.get("tool_calls") or ():
                    function = tc.get("function") or {}
                    if tc.get("id"):
                        call = {
                            "id": tc["id"],
                            "type": "function",
                            "function": {"name": function.get("name", ""), "arguments": ""},
                        }
                        gen.tool_calls.append(call)
                        yield from opened("function_call", "fc", call=call)
                    arguments = function.get("arguments")
                    if arguments and open_item is not None and "call" in open_item:
                        open_item["call"]["function"]["arguments"] += arguments
                        where = {"item_id": open_item["id"], "output_index": index}
                        yield send(
                            "response.function_call_arguments.delta", **where, delta=arguments
                        )
        yield from close()
        if not self.api.llm.logprobs:
            gen.entries = None
        if not self.api.llm.token_ids:
            gen.prompt = gen.ids = None
        yield send("response.completed", response=self.finish(gen))


def _whole(payload: dict[str, Any]) -> _Generation:
    choice = payload["choices"][0]
    message = choice["message"]
    logprobs = choice.get("logprobs")
    return _Generation(
        prompt=payload.get("prompt_token_ids"),
        ids=choice.get("token_ids"),
        entries=logprobs.get("content") if logprobs else None,
        content=message.get("content") or "",
        reasoning=message.get("reasoning") or message.get("reasoning_content") or "",
        tool_calls=list(message.get("tool_calls") or ()),
        finish_reason=choice.get("finish_reason"),
        usage=payload.get("usage"),
    )


def _sse(chunks: Iterator[bytes]) -> Iterator[dict[str, Any]]:
    for line in chunks:
        data = line.decode().removeprefix("data: ").strip()
        if data and data != "[DONE]":
            yield json.loads(data)


def _message_item(
    item_id: str, text: str, logprobs: list[dict[str, Any]] | None, status: str
) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [part],
    }


def _reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}]
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content, "status": status}


def _call_item(item_id: str, call: dict[str, Any], status: str) -> dict[str, Any]:
    function = call["function"]
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call["id"],
        "name": function["name"],
        "arguments": function["arguments"] if status == "completed" else "",
        "status": status,
    }


def _stream_logprob(entry: dict[str, Any]) -> dict[str, Any]:
    """A logprob as vLLM streams it on ``output_text.delta`` (no ``bytes``)."""
    top = [{"token": t["token"], "logprob": t["logprob"]} for t in entry.get("top_logprobs") or ()]
    return {"token": entry["token"], "logprob": entry["logprob"], "top_logprobs": top}


def _raw(text: str, tokens: list[int]) -> dict[str, Any]:
    return {"message": text, "tokens": tokens, "type": "raw_message_tokens"}


def _error(status: int, message: str, param: str) -> Answer:
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": status}
    return status, {"error": error}, None
