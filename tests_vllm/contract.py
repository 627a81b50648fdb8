"""The capture contract, checked call by call against the server's raw bytes and ART's tokenizer.

A random-weight model writes nothing useful by itself, so a policy turn that must be a tool call
or a reasoning block is forced with vLLM's ``structured_outputs`` regex (plus a logit bias that
makes it end with ``<|im_end|>``). The forcing changes the logprob values (post-constraint), not
what the contract checks: that arttrace records exactly what vLLM sent.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from typing import Any

import art
import openai
from art.preprocessing.tokenize import TokenizedResult, tokenize_trajectory_groups
from openai.types.chat.chat_completion import Choice
from raw import Exchange, Raw, Tee

import arttrace as at
from arttrace.capture._records import LLMCall

ENDOFTEXT = 151643
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
QUESTION = "What is the weather in Paris right now?"


def model_name() -> str:
    """The name the server serves the model under (``--served-model-name``)."""
    return os.environ.get("ARTTRACE_VLLM_MODEL", "tiny-qwen")


# Tags a real Qwen model writes as one token each; vLLM's streaming reasoning parser finds
# <think>/</think> by token id, so the random model must not spell them in pieces.
TAG_IDS = {"<tool_call>": 151657, "</tool_call>": 151658, "<think>": 151667, "</think>": 151668}


def forced(text: str, **kwargs: Any) -> dict[str, Any]:
    """Request arguments that make the model write ``text`` (its tags as single tokens) and
    then ``<|im_end|>`` (not ``<|endoftext|>``)."""
    regex = re.sub(r"([\\.^$|?*+()\[\]{}])", r"\\\1", text).replace("\n", "\\n")
    bias = {str(ENDOFTEXT): -100} | {str(i): 100 for tag, i in TAG_IDS.items() if tag in text}
    return {
        "extra_body": {"structured_outputs": {"regex": regex}},
        "logit_bias": bias,
        "max_tokens": 200,
        **kwargs,
    }


def two_runs(example: str, rollout: Callable[[int], object]) -> list[at.Trajectory]:
    """Two runs of ``rollout(seed)``, one group with rewards 1 and 0 (so ART gives neither
    advantage 0 and trains both)."""
    runs = []
    for number, reward in enumerate([1.0, 0.0]):
        with at.trajectory(example, metadata={"run": number}) as t:
            rollout(number)
            t.reward = reward
        runs.append(t)
    return runs


def ask(
    client: openai.OpenAI, messages: list[dict[str, Any]], *, stream: bool, **kwargs: Any
) -> dict[str, Any]:
    """One model call, read as an agent reads it; returns the assistant message to append."""
    request: dict[str, Any] = {"model": model_name(), "messages": messages, **kwargs}
    if not stream:
        message = client.chat.completions.create(**request).choices[0].message
        out: dict[str, Any] = {"role": "assistant", "content": message.content}
        if message.tool_calls:
            out["tool_calls"] = [tc.model_dump(exclude_none=True) for tc in message.tool_calls]
        return out
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for chunk in client.chat.completions.create(**request, stream=True):
        for part in chunk.choices:
            content.append(part.delta.content or "")
            for tc in part.delta.tool_calls or ():
                empty = {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                slot = calls.setdefault(tc.index, empty)
                slot["id"] += tc.id or ""
                if tc.function is not None:
                    slot["function"]["name"] += tc.function.name or ""
                    slot["function"]["arguments"] += tc.function.arguments or ""
    out = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        out["tool_calls"] = [calls[k] for k in sorted(calls)]
    return out


# -- recorded == sent ----------------------------------------------------------------------


def check_recorded_as_sent(runs: list[at.Trajectory], tee: Tee) -> list[tuple[LLMCall, Raw]]:
    """Each chat call on the wire (the runs made them one after another, in order) is recorded
    once, in its own run, trainable, with the server's exact data."""
    exchanges = tee.completions()
    calls = [c for t in runs for c in sorted(t.calls, key=lambda c: c.seq)]
    assert len(calls) == len(exchanges), "a call on the wire was lost, or recorded twice"
    return [(c, check_call(c, e)) for c, e in zip(calls, exchanges, strict=True)]


def check_call(call: LLMCall, exchange: Exchange) -> Raw:
    raw = Raw.read(exchange)
    body = exchange.body
    assert call.trainable, "a policy call (inside @trainable) was recorded as context"
    assert call.streamed == bool(body.get("stream"))
    # what arttrace asked of the server for a trainable call
    assert body.get("logprobs") is True and body.get("return_token_ids") is True, body
    assert raw.prompt_token_ids, "the server sent no prompt_token_ids: arttrace did not ask"
    assert call.prompt_token_ids is not None
    assert call.prompt_token_ids.tolist() == raw.prompt_token_ids
    assert sorted(c.index for c in call.choices) == sorted(raw.choices)
    for choice in call.choices:
        sent = raw.choices[choice.index]
        assert sent.had_token_ids and sent.token_ids, "vLLM sent no token_ids"
        # the server flag --return-tokens-as-token-ids is on: every token names its id
        assert sent.tokens == [f"token_id:{i}" for i in sent.token_ids]
        assert choice.token_ids is not None and choice.token_ids.tolist() == sent.token_ids
        assert choice.logprobs is not None and choice.logprobs.tolist() == sent.logprobs
        assert choice.finish_reason == sent.finish_reason
        assert call.untrainable_reason(choice) is None, call.untrainable_reason(choice)
        message = choice.message
        assert message.get("role") == "assistant"
        assert (message.get("content") or None) == (sent.content or None)
        assert message.get("reasoning") == sent.reasoning
        assert tool_calls_of(message) == tool_calls_of({"tool_calls": sent.tool_calls})
    if call.streamed:
        assert raw.prompt_token_id_events == len(raw.choices)  # one role chunk per choice
    if raw.usage is not None:
        assert call.usage is not None
        for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
            assert call.usage[key] == raw.usage[key], key
        assert raw.usage["prompt_tokens"] == len(raw.prompt_token_ids)
        assert raw.usage["completion_tokens"] == sum(len(c.token_ids) for c in raw.choices.values())
    return raw


def tool_calls_of(message: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    out: list[tuple[str, str, str | None]] = []
    for tc in message.get("tool_calls") or ():
        function = tc.get("function") or {}
        out.append((tc.get("id") or "", function.get("name") or "", function.get("arguments")))
    return out


# -- ART trains exactly the sampled tokens --------------------------------------------------


def check_art_masks_exactly_the_sampled_ids(
    tokenizer: Any, runs: list[at.Trajectory]
) -> list[TokenizedResult]:
    """ART's tokenizer, fed ``to_art()`` of ``runs`` as one group (rewards must differ), puts
    under its assistant mask exactly each trainable turn's sampled ids, with their logprobs,
    and nothing else (every other position has logprob NaN)."""
    trajectories = [t.to_art() for t in runs]
    results = list(
        tokenize_trajectory_groups(
            tokenizer,
            [art.TrajectoryGroup(trajectories)],
            allow_training_without_logprobs=False,
            scale_rewards=True,
        )
    )
    for number, (run, trajectory) in enumerate(zip(runs, trajectories, strict=True)):
        choices = art_choices(trajectory)
        assert len(choices) == run.trainable_turns
        mine = [r for r in results if r.trajectory.metadata["run"] == number]
        assert mine, f"ART dropped run {number} (its advantage was 0?)"
        masked: list[tuple[list[int], list[float]]] = []
        for result in mine:
            masked += masked_runs(result)
        expected = [
            (
                list((c.model_extra or {})["token_ids"]),
                [t.logprob for t in c.logprobs.content or ()],
            )
            for c in choices
            if c.logprobs is not None
        ]
        assert sorted(masked) == sorted(expected)
    return results


def masked_runs(result: TokenizedResult) -> list[tuple[list[int], list[float]]]:
    """The stretches under ART's assistant mask (one per sampled turn: turns are separated by
    prompt tokens), with their logprobs; positions outside the mask must have logprob NaN."""
    out: list[tuple[list[int], list[float]]] = []
    previous = 0
    for token, logprob, mask in zip(
        result.token_ids, result.logprobs, result.assistant_mask, strict=True
    ):
        if mask:
            if not previous:
                out.append(([], []))
            out[-1][0].append(token)
            out[-1][1].append(logprob)
        else:
            assert math.isnan(logprob)
        previous = mask
    return out


def art_choices(trajectory: art.Trajectory) -> list[Choice]:
    histories = [trajectory.messages_and_choices] + [
        h.messages_and_choices for h in trajectory.additional_histories
    ]
    return [item for history in histories for item in history if isinstance(item, Choice)]
