"""Several policies in one run: each call keeps the policy it belongs to, and
``to_art(policy=...)`` gives one policy's trajectory (its turns trainable, the others' context)."""

from __future__ import annotations

import json
from typing import Any

import art
import openai
from openai.types.chat.chat_completion import Choice

import arttrace as at
from arttrace.testing import Reply, ScriptedLLM


def ask(client: openai.OpenAI, model: str, system: str, user: str, **kw: Any) -> str:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    reply = client.chat.completions.create(model=model, messages=messages, **kw)
    return reply.choices[0].message.content or ""


def items(result: art.Trajectory) -> list[Any]:
    return [
        item
        for history in [result, *result.additional_histories]
        for item in history.messages_and_choices
    ]


def choices(result: art.Trajectory) -> list[str]:
    return [i.message.content for i in items(result) if isinstance(i, Choice)]


def context_turns(result: art.Trajectory) -> list[str]:
    return [i["content"] for i in items(result) if isinstance(i, dict) and i["role"] == "assistant"]


def run_planner_and_executor(client: openai.OpenAI, planner: str, executor: str) -> at.Trajectory:
    """A planner that plans twice and an executor that carries out each plan, in one run."""

    @at.trainable(name="plan", policy=None if planner != executor else "planner")
    def plan(task: str) -> str:
        return ask(client, planner, "You plan.", task)

    @at.trainable(name="execute", policy=None if planner != executor else "executor")
    def execute(step: str) -> str:
        return ask(client, executor, "You execute.", step)

    with at.trajectory("ex") as t:
        for task in ("task one", "task two"):
            execute(plan(task))
        t.reward = 1.0
    return t


SCRIPT = [Reply("plan one"), Reply("done one"), Reply("plan two"), Reply("done two")]


def test_each_policy_gets_exactly_its_own_turns_as_choices(instrumented, clients):
    client, _ = clients(ScriptedLLM(SCRIPT))
    t = run_planner_and_executor(client, "planner", "executor")
    assert all(c.trainable and c.policy is None for c in t.calls)

    assert sorted(choices(t.to_art())) == ["done one", "done two", "plan one", "plan two"]
    ids = {c.choices[0].message["content"]: c.choices[0].token_ids.tolist() for c in t.calls}
    prompts = {c.choices[0].message["content"]: c.prompt_token_ids.tolist() for c in t.calls}
    for policy, own, other in (
        ("planner", ["plan one", "plan two"], ["done one", "done two"]),
        ("executor", ["done one", "done two"], ["plan one", "plan two"]),
    ):
        result = t.to_art(policy=policy)
        assert sorted(choices(result)) == own
        assert sorted(context_turns(result)) == other
        for item in items(result):  # the server's own ids, as the record holds them
            if isinstance(item, Choice):
                assert item.logprobs is not None
                assert item.model_extra["token_ids"] == ids[item.message.content]
                assert item.model_extra["prompt_token_ids"] == prompts[item.message.content]
        # the main history is the policy's own
        assert isinstance(result.messages_and_choices[-1], Choice)
        assert result.messages_and_choices[-1].message.content in own
        assert result.reward == 1.0


def test_names_callables_and_lora_steps_claim_turns(instrumented, clients):
    client, _ = clients(ScriptedLLM(SCRIPT))
    t = run_planner_and_executor(client, "planner-001@7", "executor")
    assert sorted(choices(t.to_art(policy={"planner-001"}))) == ["plan one", "plan two"]
    assert sorted(choices(t.to_art(policy=["planner-001@7"]))) == ["plan one", "plan two"]
    by_model = t.to_art(policy=lambda call: call.model == "executor")
    assert sorted(choices(by_model)) == ["done one", "done two"]
    assert choices(t.to_art(policy="nobody")) == []
    assert sorted(context_turns(t.to_art(policy="nobody"))) == [
        "done one",
        "done two",
        "plan one",
        "plan two",
    ]


def test_trainable_names_the_policy_when_roles_share_a_model(instrumented, clients, spans):
    client, _ = clients(ScriptedLLM(SCRIPT))
    t = run_planner_and_executor(client, "shared", "shared")
    assert [(c.model, c.agent, c.policy) for c in t.calls] == [
        ("shared", "plan", "planner"),
        ("shared", "execute", "executor"),
        ("shared", "plan", "planner"),
        ("shared", "execute", "executor"),
    ]
    assert sorted(choices(t.to_art(policy="planner"))) == ["plan one", "plan two"]
    assert sorted(choices(t.to_art(policy="executor"))) == ["done one", "done two"]
    # a named policy is claimed by its name, not by the model name it shares
    assert choices(t.to_art(policy="shared")) == []
    named = {s.attributes.get("arttrace.policy") for s in spans.get_finished_spans()}
    assert {"planner", "executor"} <= named


def test_the_policy_is_journaled_and_an_old_journal_still_loads(instrumented, clients):
    client, _ = clients(ScriptedLLM(SCRIPT))
    t = run_planner_and_executor(client, "shared", "shared")
    saved = json.loads(json.dumps(t.to_dict()))
    assert [c["policy"] for c in saved["calls"]] == ["planner", "executor"] * 2
    loaded = at.Trajectory.from_dict(saved)
    assert [c.policy for c in loaded.calls] == ["planner", "executor"] * 2
    assert loaded.to_art(policy="executor").model_dump() == t.to_art(policy="executor").model_dump()

    for call in saved["calls"]:  # a journal written before calls had a policy
        del call["policy"]
    old = at.Trajectory.from_dict(saved)
    assert [c.policy for c in old.calls] == [None] * 4
    assert sorted(choices(old.to_art())) == ["done one", "done two", "plan one", "plan two"]
    assert choices(old.to_art(policy="shared")) != []
