"""A call seen by a framework and by the OpenAI shim is one call: the shim's tokens, the
framework's names. Driven through the public core an integration uses (FrameworkCall)."""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import pytest
from openai.types.chat.chat_completion import Choice

import arttrace as at
from arttrace.capture import _warnings
from arttrace.integrations._core import FrameworkCall, choice_record
from arttrace.testing import Reply, ScriptedLLM, ToolCall

USER = [{"role": "user", "content": "What is 1+2?"}]


def _framework_choice(message: Any) -> Any:
    """What a framework hands back: the message in OpenAI form, no token ids."""
    return choice_record(message.model_dump(exclude_none=True), finish_reason="stop")


def test_a_call_seen_by_both_layers_is_kept_once_with_exact_tokens(instrumented, clients):
    client, _ = clients(ScriptedLLM([Reply(tool_calls=[ToolCall("add", {"a": 1, "b": 2})])]))

    @at.trainable
    def agent() -> None:
        seen = FrameworkCall("someframework", "policy", USER, step="planner")
        message = client.chat.completions.create(model="policy", messages=USER).choices[0].message
        seen.finish([_framework_choice(message)])

    with at.trajectory("q") as t:
        agent()
    (call,) = t.calls
    assert (call.source, call.framework, call.step) == ("openai", "someframework", "planner")
    assert call.prompt_token_ids is not None and call.choices[0].token_ids is not None
    t.reward = 1.0
    (turn,) = t.to_art().messages_and_choices[1:]
    assert isinstance(turn, Choice) and turn.message.tool_calls[0].function.name == "add"

    loaded = at.Trajectory.from_dict(t.to_dict())
    assert [(c.framework, c.step) for c in loaded.calls] == [("someframework", "planner")]
    assert loaded.trainable_turns == 1


async def test_overlapping_calls_pair_by_response(instrumented, clients):
    """Two framework calls open at once in one run: each is paired with its own shim call."""
    llm = ScriptedLLM(lambda request: Reply(f"answer to {request['messages'][-1]['content']}"))
    _, client = clients(llm)

    async def step(name: str, question: str, delay: float) -> None:
        messages = [{"role": "user", "content": question}]
        seen = FrameworkCall("someframework", "policy", messages, step=name)
        await asyncio.sleep(delay)
        reply = await client.chat.completions.create(model="policy", messages=messages)
        seen.finish([_framework_choice(reply.choices[0].message)])

    @at.trainable
    async def agent() -> None:
        await asyncio.gather(step("slow", "a", 0.05), step("fast", "b", 0.0))

    async with at.trajectory("q") as t:
        await agent()
    assert {(c.messages[0]["content"], c.step, c.source) for c in t.calls} == {
        ("a", "slow", "openai"),
        ("b", "fast", "openai"),
    }


def test_a_failed_call_is_kept_once(instrumented, clients):
    client, _ = clients(ScriptedLLM([]))  # an exhausted script answers 500

    with at.trajectory("q") as t:
        seen = FrameworkCall("someframework", "policy", USER)
        with pytest.raises(Exception) as raised:
            client.chat.completions.create(model="policy", messages=USER)
        seen.fail(raised.value)
    (call,) = t.calls
    assert call.source == "openai" and call.framework == "someframework" and call.error


def test_a_call_only_the_framework_saw_is_context_and_warns_once_with_the_fix(clients):
    client, _ = clients(ScriptedLLM([Reply("3"), Reply("4")]))  # the shim is not installed
    fix = "Route the model through the OpenAI SDK and call arttrace.instrument()."

    @at.trainable
    def agent() -> None:
        for _ in range(2):
            seen = FrameworkCall("someframework", "policy", USER, fix=fix)
            message = (
                client.chat.completions.create(model="policy", messages=USER, logprobs=True)
                .choices[0]
                .message
            )
            seen.finish([_framework_choice(message)])

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with at.trajectory("q") as t:
            agent()
    relevant = [w for w in caught if issubclass(w.category, at.UntrainableTurnWarning)]
    assert len(relevant) == 1 and fix in str(relevant[0].message)
    assert [c.source for c in t.calls] == ["someframework", "someframework"]
    assert t.trainable_turns == 0
    t.reward = 0.0
    # Two conversations of one turn each: the later is the main one (the run's last answer).
    assert [m["content"] for m in t.to_art().messages_and_choices] == ["What is 1+2?", "4"]


def test_outside_a_trajectory_nothing_is_recorded():
    seen = FrameworkCall("someframework", "policy", USER)
    seen.finish([choice_record({"role": "assistant", "content": "3"})])
    assert seen.trajectory is None and not seen.call.trainable


def test_a_response_after_the_trajectory_ended_changes_nothing():
    with at.trajectory("q") as t:
        seen = FrameworkCall("someframework", "policy", USER)
    seen.finish([choice_record({"role": "assistant", "content": "late"})])
    (call,) = t.calls
    assert call.partial and call.choices == [] and "ended" in (call.error or "")


def test_a_later_sdk_call_does_not_hide_a_framework_only_turns_warning(instrumented, clients):
    """The shim saw a judge call while the framework's policy call was open; the policy call
    itself never went through the SDK, so its turn still says why it cannot be trained."""
    client, _ = clients(ScriptedLLM([Reply("judged")]))
    _warnings.reset()  # an earlier test warned for this model and reason

    @at.trainable(model="policy")
    def agent() -> None:
        seen = FrameworkCall("someframework", "policy", USER, fix="route it through the SDK")
        client.chat.completions.create(model="judge", messages=[{"role": "user", "content": "?"}])
        seen.finish([choice_record({"role": "assistant", "content": "3"}, finish_reason="stop")])

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with at.trajectory("q") as t:
            agent()
    relevant = [w for w in caught if issubclass(w.category, at.UntrainableTurnWarning)]
    assert len(relevant) == 1 and "route it through the SDK" in str(relevant[0].message)
    assert [(c.source, c.model) for c in t.calls] == [
        ("someframework", "policy"),
        ("openai", "judge"),
    ]
    assert t.trainable_turns == 0
