"""RULER: an LLM judge scores a group's runs relative to each other.

GRPO only needs each run's reward relative to the others of its group, and a judge ranks
runs side by side more reliably than it scores one alone (ART's RULER, whose idea this is).
This judge sees every run whole: its main conversation and every other history it made
(sub-agents, summaries, context resets), tool calls and their results included, which ART's
``ruler_score_group`` refuses.

One judge call per group: the runs' shared beginning (the system prompt and the task, most
often) is shown once, then each run. The judge answers with JSON (a JSON schema is asked
for), one score in ``[0, 1]`` per run id; a malformed answer is sent back to the judge with
what was wrong, at most ``max_attempts`` calls in all, then the group fails with the cause.

``max_attempts`` is the one retry budget: the OpenAI client's own retries are turned off for
the judge's calls, and a server error (HTTP 408, 409, 429, 5xx, a timeout or a lost
connection, the ones that client retries) is retried here, after a short wait, within the
same budget. So every request the judge's server saw is counted in ``judge_calls``.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Mapping, Sequence
from textwrap import dedent
from typing import TYPE_CHECKING, Any, Literal

from .._errors import ArttraceError, ConfigurationError
from ..capture._conversations import Conversation, Turn, latest
from ..training._group import Group, GroupRewards, uncaptured

if TYPE_CHECKING:
    import openai

__all__ = ["DEFAULT_RUBRIC", "JudgeError", "Ruler", "ruler"]

DEFAULT_RUBRIC = dedent(
    """\
    - A run that reaches the goal of the task scores clearly higher than one that does not.
    - Of two runs that reach it, the one that gets there more directly (fewer wasted steps,
      tool calls or words) scores higher.
    - A run that makes real progress toward the goal without reaching it earns partial
      credit; one that makes things worse (wrong actions, made-up facts) earns none.
    - Let the gap between two scores match the gap in quality: close runs, close scores.
    - Judge what a run did (its messages, tool calls and their results), not what it claims.
    """
)
"""The rubric :func:`ruler` uses unless given another: it holds for most tasks, since the
judge learns the task itself from the runs' system prompt and first messages."""

_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "scores": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "run_id": {"type": "string"},
                    "explanation": {"type": "string"},
                    "score": {"type": "number", "minimum": 0, "maximum": 1},
                },
                "required": ["run_id", "explanation", "score"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["scores"],
    "additionalProperties": False,
}
"""What the judge answers: the explanation comes before the score, so it reasons first."""

_INSTRUCTIONS = """\
You compare several runs of one AI agent, all given the same task, and score each run
between 0 and 1. A run may hold several conversations: its main one, and others the agent
started along the way (sub-agents, summaries, restarts); judge each run as a whole, by what
it achieved and how, its tool calls and their results included. Scores are compared within
this group only.

Rubric:
{rubric}
Answer with a JSON object and nothing else:
{{"scores": [{{"run_id": "<id>", "explanation": "<one or two sentences>", "score": <0..1>}}]}}
with exactly one entry for each of these run ids: {ids}."""


class JudgeError(ArttraceError, RuntimeError):
    """The judge gave no usable answer in ``max_attempts`` calls; the message says what was
    wrong with the last one. ``metrics`` is what the attempts cost (tokens, calls, time)."""

    def __init__(self, message: str, metrics: Mapping[str, float]) -> None:
        super().__init__(message)
        self.metrics = dict(metrics)


class Ruler:
    """A group reward function (``Trainer(group_reward=...)``) that asks an LLM judge to score
    a group's runs relative to each other. Build it with :func:`ruler`."""

    def __init__(
        self,
        model: str,
        client: openai.AsyncOpenAI | None,
        base_url: str | None,
        api_key: str | None,
        rubric: str,
        max_attempts: int,
        response_format: Literal["json_schema", "json_object", "none"],
        temperature: float | None,
        max_tokens: int | None,
        extra_body: Mapping[str, Any] | None,
        timeout: float | None,
    ) -> None:
        self.model, self.rubric = model, rubric
        self.max_attempts, self.response_format = max_attempts, response_format
        self.temperature, self.max_tokens = temperature, max_tokens
        self.extra_body = dict(extra_body or {})
        self.timeout = timeout
        with_options = getattr(client, "with_options", None)
        self._given = with_options(max_retries=0) if callable(with_options) else client
        """The given client without its own retries: ``max_attempts`` is the only budget."""
        self._base_url, self._api_key = base_url, api_key
        self._clients: dict[asyncio.AbstractEventLoop, openai.AsyncOpenAI] = {}

    def __repr__(self) -> str:
        return f"ruler(model={self.model!r})"

    async def __call__(self, group: Group[Any]) -> GroupRewards:
        """Score ``group``'s runs: one judge call (more if its answer is malformed), with
        arttrace's capture off, so it never enters a run even when called inside one."""
        task = asyncio.get_running_loop().create_task(self._score(group))
        return await task  # its own context: capture is turned off there only

    async def aclose(self) -> None:
        """Close the clients this judge made (not a ``client`` it was given)."""
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()

    def messages(self, group: Group[Any]) -> list[dict[str, str]]:
        """The judge's prompt for ``group``: instructions and rubric, then the runs."""
        ids = [str(i) for i in range(1, len(group.runs) + 1)]
        system = _INSTRUCTIONS.format(rubric=self.rubric.strip() + "\n", ids=", ".join(ids))
        return [
            {"role": "system", "content": system},
            {"role": "user", "content": render(group, ids)},
        ]

    async def _score(self, group: Group[Any]) -> GroupRewards:
        return await uncaptured(lambda: self._judge(group))

    async def _judge(self, group: Group[Any]) -> GroupRewards:
        if not group.runs:
            return GroupRewards([])
        ids = [str(i) for i in range(1, len(group.runs) + 1)]
        messages = self.messages(group)
        spent = {
            "judge_calls": 0.0,
            "judge_prompt_tokens": 0.0,
            "judge_completion_tokens": 0.0,
            "judge_seconds": 0.0,
            "judge_retries": 0.0,
        }
        import openai

        client = self._client()
        problem, failed, wait = "", False, 0.0
        for attempt in range(self.max_attempts):
            if failed:  # the server failed the last call: wait a little, as the client would
                await asyncio.sleep(wait)
            started = time.perf_counter()
            try:
                response = await client.chat.completions.create(**self._request(messages))
            except openai.APIError as error:
                spent["judge_seconds"] += time.perf_counter() - started
                spent["judge_calls"] += 1
                retry = _retry_after(error, attempt)
                if retry is None:  # refused (bad model name, key, request): no use asking again
                    raise JudgeError(
                        f"the judge {self.model!r} failed: {_describe(error)}. Check the "
                        "judge's model name, base_url, api_key and response_format",
                        spent,
                    ) from error
                problem, failed, wait = _describe(error), True, retry
                if attempt + 1 < self.max_attempts:
                    spent["judge_retries"] += 1
                continue
            failed = False
            spent["judge_seconds"] += time.perf_counter() - started
            spent["judge_calls"] += 1
            if response.usage is not None:
                spent["judge_prompt_tokens"] += response.usage.prompt_tokens
                spent["judge_completion_tokens"] += response.usage.completion_tokens
            content = response.choices[0].message.content if response.choices else None
            scores, problem = parse_scores(content, ids)
            if scores is not None:
                return GroupRewards([scores[i][0] for i in ids], spent, [scores[i][1] for i in ids])
            if attempt + 1 < self.max_attempts:
                spent["judge_retries"] += 1
                messages = [
                    *messages,
                    {"role": "assistant", "content": content or ""},
                    {
                        "role": "user",
                        "content": f"That answer cannot be used: {problem}. Answer again "
                        "with the JSON object only, one entry for each run id: "
                        f"{', '.join(ids)}.",
                    },
                ]
        calls = f"{self.max_attempts} call{'s' if self.max_attempts > 1 else ''}"
        if failed:
            raise JudgeError(
                f"the judge {self.model!r} gave no usable scores in {calls}; the last: "
                f"{problem}. Check the judge's server, or raise max_attempts",
                spent,
            )
        raise JudgeError(
            f"the judge {self.model!r} gave no usable scores in {calls}; the last answer: "
            f"{problem}. Use a judge model that follows a JSON schema (response_format), or "
            "raise max_attempts",
            spent,
        )

    def _request(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        request: dict[str, Any] = {"model": self.model, "messages": messages}
        if self.response_format == "json_schema":
            request["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "run_scores", "strict": True, "schema": _SCHEMA},
            }
        elif self.response_format == "json_object":
            request["response_format"] = {"type": "json_object"}
        if self.temperature is not None:
            request["temperature"] = self.temperature
        if self.max_tokens is not None:
            request["max_tokens"] = self.max_tokens
        if self.extra_body:
            request["extra_body"] = self.extra_body
        if self.timeout is not None:
            request["timeout"] = self.timeout
        return request

    def _client(self) -> openai.AsyncOpenAI:
        """The given client, or one per event loop (an async client belongs to its loop)."""
        if self._given is not None:
            return self._given
        import openai

        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            for old in [lp for lp in self._clients if lp.is_closed()]:
                del self._clients[old]
            client = openai.AsyncOpenAI(
                base_url=self._base_url, api_key=self._api_key, max_retries=0
            )
            self._clients[loop] = client
        return client


def _retry_after(error: openai.APIError, attempt: int) -> float | None:
    """Seconds to wait before asking again after ``error``, or ``None`` if asking again is
    no use: the errors the OpenAI client itself retries, with its waits (the server's
    ``Retry-After`` up to a minute, else 0.5 s doubling to 8 s, less up to a quarter)."""
    import openai

    if isinstance(error, openai.APIStatusError):
        status = error.status_code
        if status not in (408, 409, 429) and status < 500:
            return None
        header = error.response.headers.get("retry-after", "")
        try:
            asked = float(header)
        except ValueError:
            asked = -1.0
        if 0 <= asked <= 60:
            return asked
    elif not isinstance(error, openai.APIConnectionError):  # a timeout is one too
        return None  # a response the client could not read
    return min(0.5 * 2.0**attempt, 8.0) * (1 - 0.25 * random.random())


def _describe(error: openai.APIError) -> str:
    """What went wrong with a judge call, in a line: the status and the server's message."""
    import openai

    if isinstance(error, openai.APIStatusError):
        body = error.body  # the client keeps the body's "error" object, when it has one
        said = body.get("message") if isinstance(body, dict) else None
        said = said if isinstance(said, str) and said else error.response.text[:300]
        return f"its server answered HTTP {error.status_code} ({said})"
    return f"{type(error).__name__}: {error}"


def ruler(
    *,
    model: str,
    client: openai.AsyncOpenAI | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    rubric: str = DEFAULT_RUBRIC,
    max_attempts: int = 3,
    response_format: Literal["json_schema", "json_object", "none"] = "json_schema",
    temperature: float | None = None,
    max_tokens: int | None = None,
    extra_body: Mapping[str, Any] | None = None,
    timeout: float | None = None,
) -> Ruler:
    """An LLM judge as a group reward: ``Trainer(..., group_reward=ruler(model=...))``.

    Each group is one judge call over the OpenAI Chat Completions API: the runs rendered
    whole (main conversation, other histories, tool calls and results), one score in
    ``[0, 1]`` asked per run. The step's metrics get ``judge_calls``,
    ``judge_prompt_tokens``, ``judge_completion_tokens``, ``judge_seconds`` and
    ``judge_retries``, summed over its groups; each run's explanation is journaled.

    Args:
        model: The judge model's name, as its server knows it.
        client: An ``openai.AsyncOpenAI`` for the judge's server. Without it, one is made
            per event loop from ``base_url`` and ``api_key`` (each ``None``: the
            ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` environment variables).
        base_url: The judge's server, when no ``client`` is given.
        api_key: Its key, when no ``client`` is given.
        rubric: What makes a run better than another (default :data:`DEFAULT_RUBRIC`).
        max_attempts: Judge calls per group at most: an answer that is not valid JSON, or
            lacks a run, repeats one, or scores outside ``[0, 1]``, is sent back with what
            was wrong, and a server error (HTTP 429, 5xx, a timeout) is asked again, until
            this many calls; then the group fails with :class:`JudgeError` (its runs count
            under the Trainer's ``max_exceptions``). The only retry budget: the client's
            own retries are off for the judge's calls.
        response_format: ``"json_schema"`` (the default: the server constrains the answer
            to the score schema; OpenAI and vLLM do), ``"json_object"`` (JSON, no schema),
            or ``"none"`` (for a server that takes neither; the prompt still asks for JSON).
        temperature: The judge's sampling temperature (the server's default if ``None``).
        max_tokens: A limit on the judge's answer.
        extra_body: More request fields, sent as they are (vLLM's ``guided_json``, ...).
        timeout: Seconds a judge call may take (the client's default if ``None``).
    """
    if not isinstance(model, str) or not model:
        raise ConfigurationError(f"ruler needs the judge's model name, got {model!r}")
    if client is not None and (base_url is not None or api_key is not None):
        raise ConfigurationError(
            "ruler takes a client, or base_url and api_key to make one, not both"
        )
    if client is not None and not callable(
        getattr(getattr(getattr(client, "chat", None), "completions", None), "create", None)
    ):
        raise ConfigurationError(
            f"ruler's client must be an openai.AsyncOpenAI, got {type(client).__name__}"
        )
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise ConfigurationError(f"max_attempts must be an int >= 1, got {max_attempts!r}")
    if response_format not in ("json_schema", "json_object", "none"):
        raise ConfigurationError(
            "response_format must be 'json_schema', 'json_object' or 'none', got "
            f"{response_format!r}"
        )
    return Ruler(
        model,
        client,
        base_url,
        api_key,
        rubric,
        max_attempts,
        response_format,
        temperature,
        max_tokens,
        extra_body,
        timeout,
    )


# -- the judge's view of a group ---------------------------------------------------------------


def render(group: Group[Any], ids: Sequence[str]) -> str:
    """The runs of ``group`` as the judge reads them: the beginning all their main
    conversations share, once; the tools, once when all runs had the same; then each run with
    its main conversation and every other history, one JSON message per line.

    A conversation the agent carried on after changing an earlier message (a timestamp, a
    trimmed history) is shown once, as its timeline: the history as first sent, then what
    each later call added, not one copy of the history per call."""
    runs = [_conversations(run.trajectory.conversations()) for run in group.runs]
    mains = [[_message(item) for item in conversations[0].timeline()] for conversations in runs]
    shared = _shared_prefix(mains)
    if all(len(m) == shared for m in mains):
        shared = 0  # identical runs: show each whole rather than an empty difference
    parts = []
    if shared:
        parts.append(
            "<shared_beginning>\nEvery run's main conversation starts with:\n"
            + _lines(mains[0][:shared])
            + "\n</shared_beginning>"
        )
    tools = [conversations[0].tools for conversations in runs]
    same_tools = bool(tools[0]) and all(t == tools[0] for t in tools)
    if same_tools:
        parts.append("<tools>\n" + _tools(tools[0] or []) + "\n</tools>")
    note = "(after the shared beginning)" if shared else ""
    for run_id, conversations, main in zip(ids, runs, mains, strict=True):
        body = []
        if not same_tools and conversations[0].tools:
            body.append("<tools>\n" + _tools(conversations[0].tools) + "\n</tools>")
        body.append(f'<conversation kind="main">\n{_lines(main[shared:], note)}\n</conversation>')
        for n, other in enumerate(conversations[1:], 1):
            messages = [_message(item) for item in other.timeline()]
            body.append(f'<conversation kind="other" n="{n}">\n{_lines(messages)}\n</conversation>')
        parts.append(f'<run id="{run_id}">\n' + "\n".join(body) + "\n</run>")
    return "\n\n".join(parts)


def _conversations(conversations: list[Conversation]) -> list[Conversation]:
    """The run's main conversation, then the others no conversation carries on (each read
    by its timeline, so every message shows once)."""
    if not conversations:
        return [Conversation()]
    main = conversations[0]
    return [main, *(c for c in latest(conversations) if c is not main)]


def _message(item: dict[str, Any] | Turn) -> dict[str, Any]:
    """A message as the judge reads it: role, text, tool calls (name and arguments), the
    tool call a result answers; no token data, no reasoning."""
    message = item.choice.message if isinstance(item, Turn) else item
    out: dict[str, Any] = {"role": message.get("role", "assistant")}
    if message.get("name"):
        out["name"] = message["name"]
    if message.get("tool_call_id"):
        out["tool_call_id"] = message["tool_call_id"]
    content = _text(message.get("content"))
    if content is not None:
        out["content"] = content
    calls = message.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [
            {
                "id": call.get("id"),
                "name": (call.get("function") or {}).get("name"),
                "arguments": (call.get("function") or {}).get("arguments"),
            }
            for call in calls
            if isinstance(call, dict)
        ]
    return out


def _text(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: the text, and a mark for the rest
        return "".join(
            p.get("text", "") if p.get("type") == "text" else f"[{p.get('type', 'part')}]"
            for p in content
            if isinstance(p, dict)
        )
    return str(content)


def _lines(messages: Sequence[dict[str, Any]], note: str = "") -> str:
    lines = [json.dumps(m, ensure_ascii=False, separators=(",", ":")) for m in messages]
    return "\n".join(([note] if note else []) + lines) or "(no messages)"


def _tools(tools: Sequence[dict[str, Any]]) -> str:
    return "\n".join(json.dumps(t, ensure_ascii=False, separators=(",", ":")) for t in tools)


def _shared_prefix(lists: Sequence[Sequence[dict[str, Any]]]) -> int:
    first, n = lists[0], 0
    while n < len(first) and all(len(m) > n and m[n] == first[n] for m in lists):
        n += 1
    return n


# -- the judge's answer ------------------------------------------------------------------------


def parse_scores(
    content: str | None, ids: Sequence[str]
) -> tuple[dict[str, tuple[float, str]] | None, str]:
    """``(run id -> (score, explanation), "")`` from the judge's answer, or ``(None, what
    was wrong)``: one score per id, each a number in ``[0, 1]``."""
    if not content or not content.strip():
        return None, "it was empty"
    text = content.strip()
    if text.startswith("```"):  # a fenced block, as chat models like to answer
        text = text.strip("`").removeprefix("json").strip()
    try:
        data = json.loads(text)
    except ValueError as error:
        return None, f"it is not JSON ({error}): {content[:200]!r}"
    entries = data.get("scores") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return None, 'it has no "scores" list'
    scores: dict[str, tuple[float, str]] = {}
    problems: list[str] = []
    for entry in entries:
        if not isinstance(entry, dict):
            problems.append(f"an entry is {type(entry).__name__}, not an object")
            continue
        run_id, score = str(entry.get("run_id")), entry.get("score")
        if run_id not in ids:
            problems.append(f"run id {run_id!r} is not one of {', '.join(ids)}")
        elif run_id in scores:
            problems.append(f"run {run_id} is scored twice")
        elif (
            isinstance(score, bool)
            or not isinstance(score, int | float)
            or not math.isfinite(score)
            or not 0 <= score <= 1
        ):
            problems.append(f"run {run_id}'s score {score!r} is not a number in [0, 1]")
        else:
            scores[run_id] = float(score), str(entry.get("explanation", ""))
    missing = [i for i in ids if i not in scores and not any(f"run {i}" in p for p in problems)]
    if missing:
        problems.append(f"run{'s' if len(missing) > 1 else ''} {', '.join(missing)} not scored")
    if problems:
        return None, "; ".join(problems)
    return scores, ""
