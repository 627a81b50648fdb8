"""The CPU backend's inference server: OpenAI Chat Completions on 127.0.0.1, answering as vLLM
does with ``--return-tokens-as-token-ids`` (see ``research/vllm_protocol.md``).

Every response carries the top-level ``prompt_token_ids``, per-choice ``token_ids`` (the end
token included) and, when asked, ``logprobs`` whose tokens are ``token_id:<id>``. Streams send a
role chunk per choice carrying ``prompt_token_ids``, then one chunk per sampled token with its
``token_ids`` and logprob; ``n`` choices interleave. A completion in the Hermes format Qwen's
template teaches (``<tool_call>{"name": ..., "arguments": ...}</tool_call>``) is returned as
``tool_calls``, with the text before it as ``content``.

A request without a ``seed`` samples from a seed of its own (:class:`SamplingSeeds`), never
from torch's global generator: which concurrent request drew first would otherwise decide
every sample, and the same seed would not give the same run.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .._asgi_server import ServerThread
from .._tokenizers._chat import HFChatTokenizer
from ._cpu_model import Policy, Sample, Token

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class SamplingSeeds:
    """The seed of each request that brings none: a hash of the backend's seed, the weights'
    step, the prompt's token ids and how many requests with that prompt came before it at
    this step (and ``salt``: a second model of one backend samples apart from the first).

    Concurrent requests arrive and run in an order that varies from run to run; with these
    seeds only the order among requests for the same prompt varies, and those are
    interchangeable (a group's runs of one example), so the same requests give the same
    samples: the same set for each prompt, whichever run of a group gets which."""

    def __init__(self, seed: int, step: Callable[[], int], salt: str = "") -> None:
        self._seed, self._step, self._salt = seed, step, salt.encode()
        self._at: int | None = None
        self._seen: Counter[bytes] = Counter()
        self._lock = threading.Lock()

    def next(self, prompt: list[int]) -> int:
        key = hashlib.blake2b(",".join(map(str, prompt)).encode(), digest_size=16).digest()
        step = self._step()
        with self._lock:
            if step != self._at:  # new weights: count afresh (the step is in the seed)
                self._at = step
                self._seen.clear()
            before = self._seen[key]
            self._seen[key] += 1
        head = f"{self._seed}:{step}:{before}:".encode()
        digest = hashlib.blake2b(head + key + self._salt, digest_size=8)
        return int.from_bytes(digest.digest()) >> 1  # torch takes up to 64 bits


@dataclass(frozen=True)
class Served:
    """What a served model name answers with: its policy, and its seedless requests' seeds
    (without them, torch's global generator)."""

    policy: Policy
    seeds: SamplingSeeds | None = None


class PolicyServer:
    """Serves policies from a uvicorn thread: ``served()`` maps each model name it accepts
    to the policy that answers it. ``policy``'s tokenizer renders the prompts and decodes the
    replies of every served policy (they are one base model's fine-tunes)."""

    def __init__(
        self,
        policy: Policy,
        served: Callable[[], Mapping[str, Served]],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str = "cpu",
        max_tokens: int = 256,
    ) -> None:
        self.policy, self.served, self.api_key = policy, served, api_key
        self.max_tokens = max_tokens
        self.chat = HFChatTokenizer(policy.tokenizer)
        app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat_completions, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/health", lambda _: Response(), methods=["GET"]),
            ]
        )
        self._serving = ServerThread(app, host, port, name="the CPU backend's server")

    @property
    def base_url(self) -> str:
        host, port = self._serving.address
        return f"http://{host}:{port}/v1"

    def start(self) -> None:
        self._serving.start()

    def stop(self) -> None:
        self._serving.stop()

    # -- routes -----------------------------------------------------------------------------

    async def _models(self, request: Request) -> Response:
        data = [{"id": name, "object": "model", "owned_by": "arttrace"} for name in self.served()]
        return JSONResponse({"object": "list", "data": data})

    async def _chat_completions(self, request: Request) -> Response:
        try:
            body = await request.json()
            plan = self._plan(body)
        except BadRequest as error:
            return _error(str(error), error.status)
        except ValueError as error:
            return _error(f"invalid request: {error}", 400)
        if body.get("stream"):
            return StreamingResponse(self._stream(plan), media_type="text/event-stream")
        samples = await run_in_threadpool(lambda: _drain(self._generate(plan)))
        return JSONResponse(self._response(plan, samples))

    # -- requests ---------------------------------------------------------------------------

    def _plan(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            raise BadRequest("'messages' (a list of chat messages) is required")
        model = body.get("model")
        served = self.served().get(model) if isinstance(model, str) else None
        if served is None:
            raise BadRequest(f"The model `{model}` does not exist.", 404)
        policy = served.policy
        try:
            prompt = self.chat.prompt(body["messages"], body.get("tools"))
        except Exception as error:  # the chat template rejected the messages
            raise BadRequest(f"the chat template cannot render these messages: {error}") from error
        n = int(body.get("n") or 1)
        if not 1 <= n <= 64:
            raise BadRequest("'n' must be between 1 and 64")
        limit = body.get("max_completion_tokens") or body.get("max_tokens") or self.max_tokens
        if len(prompt) >= policy.max_length:
            raise BadRequest(
                f"the prompt has {len(prompt)} tokens; this model's context is {policy.max_length}"
            )
        temperature = body.get("temperature")
        seed = body.get("seed")
        if seed is not None:
            seed = int(seed)
        elif served.seeds is not None:
            seed = served.seeds.next(prompt)
        return {
            "policy": policy,
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": model,
            "prompt": prompt,
            "n": n,
            "max_tokens": int(limit),
            "temperature": 1.0 if temperature is None else float(temperature),
            "top_p": float(body.get("top_p") or 1.0),
            "seed": seed,
            "logprobs": bool(body.get("logprobs")),
            "top_logprobs": int(body.get("top_logprobs") or 0),
            "ids": body.get("return_token_ids") is not False,
            "as_ids": body.get("return_tokens_as_token_ids") is not False,
            "usage": bool((body.get("stream_options") or {}).get("include_usage")),
        }

    def _generate(self, plan: dict[str, Any]) -> Iterator[tuple[int, Token, Sample]]:
        policy: Policy = plan["policy"]
        yield from policy.generate(
            plan["prompt"],
            n=plan["n"],
            max_tokens=plan["max_tokens"],
            temperature=plan["temperature"],
            top_p=plan["top_p"],
            top_logprobs=plan["top_logprobs"],
            seed=plan["seed"],
        )

    # -- responses --------------------------------------------------------------------------

    def _response(self, plan: dict[str, Any], samples: list[Sample]) -> dict[str, Any]:
        choices = []
        for index, sample in enumerate(samples):
            message, finish = self._message(sample)
            choice: dict[str, Any] = {
                "index": index,
                "message": message,
                "logprobs": {"content": [self._entry(plan, t) for t in sample.tokens]}
                if plan["logprobs"]
                else None,
                "finish_reason": finish,
                "stop_reason": None,
            }
            if plan["ids"]:
                choice["token_ids"] = [t.token_id for t in sample.tokens]
            choices.append(choice)
        return {
            "id": plan["id"],
            "object": "chat.completion",
            "created": plan["created"],
            "model": plan["model"],
            "choices": choices,
            "usage": _usage(plan, samples),
            "prompt_token_ids": plan["prompt"] if plan["ids"] else None,
        }

    def _stream(self, plan: dict[str, Any]) -> Iterator[bytes]:
        """Sync on purpose: Starlette iterates it in a worker thread, one token at a time."""
        head = {
            "id": plan["id"],
            "object": "chat.completion.chunk",
            "created": plan["created"],
            "model": plan["model"],
        }

        def chunk(choice: dict[str, Any], **extra: Any) -> bytes:
            return f"data: {json.dumps({**head, 'choices': [choice], **extra})}\n\n".encode()

        for index in range(plan["n"]):
            role = {"index": index, "delta": {"role": "assistant", "content": ""}}
            ids = {"prompt_token_ids": plan["prompt"]} if plan["ids"] else {}
            yield chunk({**role, "logprobs": None, "finish_reason": None}, **ids)
        samples: dict[int, Sample] = {}
        shown: dict[int, str] = {}
        for index, token, sample in self._generate(plan):
            samples[index] = sample
            delta: dict[str, Any] = {}
            finish = None
            text = self._text(sample)
            if "<tool_call>" not in text and not text.endswith("\ufffd"):
                piece = text[len(shown.get(index, "")) :]
                if piece:
                    delta = {"content": piece}
                shown[index] = text
            if sample.finish_reason is not None:
                message, finish = self._message(sample)
                if message.get("tool_calls"):
                    delta = {
                        "content": None,
                        "tool_calls": [
                            {"index": k, **call} for k, call in enumerate(message["tool_calls"])
                        ],
                    }
                elif rest := (message.get("content") or "")[len(shown.get(index, "")) :]:
                    delta = {"content": rest}
            part: dict[str, Any] = {
                "index": index,
                "delta": delta,
                "logprobs": {"content": [self._entry(plan, token)]} if plan["logprobs"] else None,
                "finish_reason": finish,
            }
            if plan["ids"]:
                part["token_ids"] = [token.token_id]
            yield chunk(part)
        if plan["usage"]:
            usage = _usage(plan, [samples[i] for i in sorted(samples)])
            yield f"data: {json.dumps({**head, 'choices': [], 'usage': usage})}\n\n".encode()
        yield b"data: [DONE]\n\n"

    def _text(self, sample: Sample) -> str:
        ids = [t.token_id for t in sample.tokens if t.token_id not in self.policy.stop_ids]
        return str(self.policy.tokenizer.decode(ids, skip_special_tokens=False))

    def _message(self, sample: Sample) -> tuple[dict[str, Any], str]:
        """The assistant message of a finished sample, and its finish reason."""
        text = self._text(sample)
        finish = sample.finish_reason or "length"
        calls: list[dict[str, Any]] = []
        for k, match in enumerate(_TOOL_CALL.finditer(text)):
            try:
                call = json.loads(match.group(1))
                name, arguments = call["name"], call.get("arguments", {})
            except (ValueError, KeyError, TypeError):
                calls = []  # not a well-formed call: the text stays content, as vLLM's parser
                break
            calls.append(
                {
                    "id": f"chatcmpl-tool-{uuid.uuid4().hex[:16]}-{k}",
                    "type": "function",
                    "function": {"name": str(name), "arguments": json.dumps(arguments)},
                }
            )
        if not calls:
            return {"role": "assistant", "content": text}, finish
        content = text[: text.index("<tool_call>")]
        message = {"role": "assistant", "content": content or None, "tool_calls": calls}
        return message, "tool_calls" if finish == "stop" else finish

    def _entry(self, plan: dict[str, Any], token: Token) -> dict[str, Any]:
        def name(token_id: int) -> str:
            return (
                f"token_id:{token_id}"
                if plan["as_ids"]
                else str(self.policy.tokenizer.decode([token_id]))
            )

        text = str(self.policy.tokenizer.decode([token.token_id]))
        return {
            "token": name(token.token_id),
            "logprob": max(token.logprob, -9999.0),
            "bytes": list(text.encode()),
            "top_logprobs": [
                {"token": name(i), "logprob": max(lp, -9999.0), "bytes": list(name(i).encode())}
                for i, lp in token.top
            ],
        }


def _drain(events: Iterator[tuple[int, Token, Sample]]) -> list[Sample]:
    samples: dict[int, Sample] = {}
    for index, _, sample in events:
        samples[index] = sample
    return [samples[i] for i in sorted(samples)]


def _usage(plan: dict[str, Any], samples: list[Sample]) -> dict[str, int]:
    completion = sum(len(s.tokens) for s in samples)
    prompt = len(plan["prompt"])
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _error(message: str, status: int) -> JSONResponse:
    kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": None, "code": status}},
        status_code=status,
    )
