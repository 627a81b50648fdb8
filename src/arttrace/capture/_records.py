"""The record of one LLM call, stored compactly (arrays, not one object per token).

A sampled token costs 8 bytes: its id as a 4-byte unsigned int and its logprob as a float32
(:func:`compact_ids`, :func:`compact_logprobs`); each falls back to 8 bytes for a value the
smaller form would not give back exactly, so a record never loses what the server sent.
"""

from __future__ import annotations

import itertools
import json
import time
from array import array
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

_TOKEN_ID_PREFIX = "token_id:"
_JSON_SCALARS = frozenset({str, int, float, bool, type(None)})
"""Types ``json.dumps`` always takes, so :func:`jsonable` need not try them."""
_sequence = itertools.count()
UNREADABLE = "arttrace could not read the response"
"""The untrainable reason of a call arttrace failed to record whole (its own failure)."""
FINISH_REASONS = frozenset({"stop", "length", "tool_calls", "content_filter", "function_call"})
"""The finish reasons an OpenAI ``Choice`` (hence a trainable ART turn) can carry."""
AS_OPENAI_FINISH_REASON = {"repetition": "length"}
"""Finish reasons of complete samples outside the OpenAI set, and the one their ART ``Choice``
carries: vLLM's ``repetition`` (its ``repetition_detection`` stopped a degenerate sample, as a
length limit would: every sampled token is there, and GRPO should penalise it, not drop it)."""
COMPLETE = FINISH_REASONS | AS_OPENAI_FINISH_REASON.keys()
TOKENS_MISSING = "the stream lost tokens"
"""The untrainable reason of a stream whose token ids fall short of the server's own count."""
NO_LOGPROBS_INCLUDE_REASONING = "no logprobs (include_reasoning=false)"
"""vLLM with a tool or reasoning parser drops logprobs and token ids when asked not to return
the reasoning."""


def token_count(value: Any) -> int | None:
    """A token count as the server sent it in ``usage``: a non-negative integer, else ``None``
    (a malformed count is not trusted, and never costs a turn its ids and logprobs)."""
    return value if type(value) is int and value >= 0 else None


def compact_ids(ids: Sequence[int]) -> array[int]:
    """Token ids as 4-byte unsigned ints (``array("I")``: every real vocabulary fits), or as
    8-byte signed ones when one does not (a negative or huge id, kept as the server sent it).

    Raises ``TypeError`` for what is not an int and ``OverflowError`` beyond 64 bits, as
    ``array`` itself does."""
    if isinstance(ids, array) and ids.typecode == "I":
        return ids
    try:
        return array("I", ids)
    except OverflowError:
        return array("q", ids)


def compact_logprobs(logprobs: Sequence[float]) -> array[float]:
    """Logprobs as float32 (``array("f")``) when that gives every value back exactly, else as
    float64: the same Python floats come back either way (``tolist()``, ``to_dict()``).

    vLLM samples and computes logprobs in float32 (vllm-project/vllm): ``Sampler.forward``
    casts the logits (``vllm/v1/sample/sampler.py:74``, ``logits.to(torch.float32)``, at
    3e342658), ``Sampler.compute_logprobs`` is ``log_softmax(dim=-1, dtype=torch.float32)``
    (:249) and ``gather_logprobs`` (:252-293) keeps that dtype; ``LogprobsTensors.tolists``
    hands them on as float32 numpy arrays (``vllm/v1/outputs.py:52-58``, at 1b55f1e9); the
    engine's ``LogprobsProcessor._update_sample_logprobs`` makes Python floats of them with
    ``.tolist()`` (``vllm/v1/engine/logprobs.py``, at dfafe710); the OpenAI server's
    ``_create_chat_logprobs`` clamps them with ``max(logprob, -9999.0)`` (exact in float32;
    ``vllm/entrypoints/openai/chat_completion/serving.py``) and pydantic writes each as the
    shortest text that reads back as that same double. So every logprob vLLM sends is a
    float32 value, kept exactly. A server that sends other values (rounded decimals, as
    OpenAI's API does) gets float64."""
    if isinstance(logprobs, array) and logprobs.typecode == "f":
        return logprobs
    single = array("f", logprobs)
    same = single == logprobs if isinstance(logprobs, array) else single.tolist() == logprobs
    return single if same else array("d", logprobs)


def token_ids_from_tokens(tokens: list[str]) -> array[int] | None:
    """Parse vLLM's ``token_id:<int>`` logprob tokens; ``None`` if any token has another form."""
    if not all(t.startswith(_TOKEN_ID_PREFIX) for t in tokens):
        return None
    try:
        return compact_ids([int(t[len(_TOKEN_ID_PREFIX) :]) for t in tokens])
    except (ValueError, OverflowError):
        return None


@dataclass(slots=True)
class ChoiceRecord:
    """One sampled choice: its message, and the exact tokens it was sampled as."""

    index: int
    message: dict[str, Any]
    finish_reason: str | None = None
    logprobs: array[float] | None = None
    """Per-token logprobs of the sampled tokens, or ``None`` if the server sent none (float32
    when exact, see :func:`compact_logprobs`)."""
    token_ids: array[int] | None = None
    """Sampled token ids (vLLM's ``token_ids``, else parsed from ``token_id:<int>`` tokens;
    4 bytes each when they fit, see :func:`compact_ids`)."""
    tokens: list[str] | None = None
    """Logprob token strings, kept only when they are not ``token_id:<int>``."""
    top_logprobs: list[list[dict[str, Any]]] | None = None
    """Alternatives per token, kept only when the request asked for them."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "message": self.message,
            "finish_reason": self.finish_reason,
            "logprobs": None if self.logprobs is None else self.logprobs.tolist(),
            "token_ids": None if self.token_ids is None else self.token_ids.tolist(),
            "tokens": self.tokens,
            "top_logprobs": self.top_logprobs,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChoiceRecord:
        logprobs, token_ids = data.get("logprobs"), data.get("token_ids")
        return cls(
            index=data["index"],
            message=data["message"],
            finish_reason=data.get("finish_reason"),
            logprobs=None if logprobs is None else compact_logprobs(logprobs),
            token_ids=None if token_ids is None else compact_ids(token_ids),
            tokens=data.get("tokens"),
            top_logprobs=data.get("top_logprobs"),
        )


@dataclass(slots=True)
class LLMCall:
    """One Chat Completions call: what the model saw and what it produced."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    choices: list[ChoiceRecord] = field(default_factory=list)
    prompt_token_ids: array[int] | None = None
    response_id: str | None = None
    response_model: str | None = None
    usage: dict[str, Any] | None = None
    trainable: bool = False
    """Made inside a ``@trainable`` function (whose model filter, if any, it matched)."""
    agent: str | None = None
    """Name of the innermost ``@trainable`` function the call was made in."""
    policy: str | None = None
    """The policy that ``@trainable`` function named (``@trainable(policy="planner")``), or
    ``None``: then the call's ``model`` says whose turn it is."""
    streamed: bool = False
    source: str = "openai"
    """The layer that recorded the call: ``"openai"`` (the SDK shim), ``"http"`` (an HTTP
    client's hook), ``"gateway"`` (an ``arttrace.Gateway``: a call of another process) or a
    framework's name."""
    framework: str | None = None
    """The framework that made the call (LangChain, LlamaIndex, ADK), when one did."""
    step: str | None = None
    """The framework's name for the step that made the call (graph node, agent)."""
    partial: bool = False
    """The response did not arrive whole (stream cut, abandoned, or malformed)."""
    error: str | None = None
    capture_error: str | None = None
    """Why arttrace could not record this call whole (a response it could not read, or its
    own failure); such a call is context, never trained on."""
    started_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    seq: int = field(default_factory=lambda: next(_sequence))

    @property
    def completion_tokens(self) -> int:
        return sum(len(c.token_ids or c.logprobs or ()) for c in self.choices)

    def untrainable_reason(self, choice: ChoiceRecord) -> str | None:
        """Why ``choice`` cannot be trained on, or ``None`` when ART accepts it."""
        if self.capture_error:
            return UNREADABLE
        if self.partial or self.error:
            return "the response was incomplete"
        if choice.logprobs is None:
            return NO_LOGPROBS_INCLUDE_REASONING if self._reasoning_off() else "no logprobs"
        if choice.token_ids is None or self.prompt_token_ids is None:
            return "no token ids"
        if len(choice.token_ids) != len(choice.logprobs):
            return "token ids and logprobs differ in length"
        if choice.finish_reason not in COMPLETE:
            return "no finish reason" if choice.finish_reason is None else "generation aborted"
        if self.streamed and self._tokens_missing():
            return TOKENS_MISSING
        return None

    def _tokens_missing(self) -> bool:
        """The server counted more sampled tokens (``usage.completion_tokens``, over all
        choices) than the stream carried ids for: vLLM 0.10.2-0.12.x drop the chunks a tool or
        reasoning parser holds back, ids and logprobs together, so the lengths still agree."""
        usage = self.usage if isinstance(self.usage, Mapping) else {}
        counted = token_count(usage.get("completion_tokens"))
        if counted is None or any(c.token_ids is None for c in self.choices):
            return False
        return counted != sum(len(c.token_ids or ()) for c in self.choices)

    def _reasoning_off(self) -> bool:
        """The request asked vLLM not to return the reasoning (``include_reasoning: false``, in
        the body or the SDK's ``extra_body``)."""
        extra = self.params.get("extra_body")
        value = extra.get("include_reasoning") if isinstance(extra, Mapping) else None
        return (self.params.get("include_reasoning") if value is None else value) is False

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": self.messages,
            "tools": self.tools,
            "params": self.params,
            "choices": [c.to_dict() for c in self.choices],
            "prompt_token_ids": None
            if self.prompt_token_ids is None
            else self.prompt_token_ids.tolist(),
            "response_id": self.response_id,
            "response_model": self.response_model,
            "usage": self.usage,
            "trainable": self.trainable,
            "agent": self.agent,
            "policy": self.policy,
            "streamed": self.streamed,
            "source": self.source,
            "framework": self.framework,
            "step": self.step,
            "partial": self.partial,
            "error": self.error,
            "capture_error": self.capture_error,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LLMCall:
        prompt = data.get("prompt_token_ids")
        fields = {k: v for k, v in data.items() if k not in ("choices", "prompt_token_ids")}
        return cls(
            **fields,
            choices=[ChoiceRecord.from_dict(c) for c in data.get("choices", [])],
            prompt_token_ids=None if prompt is None else compact_ids(prompt),
        )


PolicyMatcher = str | Collection[str] | Callable[[LLMCall], bool]
"""Which turns a policy claims (``Trajectory.to_art(policy=...)``): a callable given each
policy turn's call, or one name or a collection of names (:func:`policy_claims`)."""


def policy_claims(policy: PolicyMatcher, call: LLMCall) -> bool:
    """Whether ``policy`` claims ``call``. Names match the policy its ``@trainable`` function
    named (``call.policy``) when it named one, else the model the call was sent to: the
    name itself, or a LoRA step of it as vLLM serves it (``planner-001@7`` for
    ``planner-001``). A callable decides itself."""
    if callable(policy):
        return bool(policy(call))
    names = {policy} if isinstance(policy, str) else set(policy)
    if call.policy is not None:
        return call.policy in names
    return model_claimed(names, call.model)


def model_claimed(names: Collection[str], model: str) -> bool:
    """Whether a call sent to ``model`` goes by one of ``names``: the name itself, or a LoRA
    step of it as vLLM serves it (``planner-001@7``)."""
    return model in names or model.rpartition("@")[0] in names


def field_of(obj: Any, name: str) -> Any:
    """A field of an SDK/framework object, or of the plain dict standing in for one."""
    if type(obj) is dict or isinstance(obj, Mapping):  # a dict first: an ABC check is slower
        return obj.get(name)
    return getattr(obj, name, None)


def jsonable(value: Any) -> Any:
    """``value`` if it survives a JSON round trip, else its ``repr`` (for request params)."""
    if type(value) in _JSON_SCALARS:
        return value
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value
