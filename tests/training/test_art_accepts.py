"""ART's own CPU preprocessing accepts what arttrace produces, token for token.

An instrumented agent talks to the scripted vLLM-like server, which returns exact Qwen2.5 token
ids (``HFChatTokenizer`` over an offline Qwen2.5-Instruct tokenizer). Its runs are converted with
``Trajectory.to_art()`` and fed to ``art.preprocessing.tokenize.tokenize_trajectory_groups``, the
function ART's trainer uses to turn trajectory groups into training sequences.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import art
import openai
import pytest
from art.preprocessing.tokenize import TokenizedResult, tokenize_trajectory_groups
from openai.types.chat.chat_completion import Choice

import arttrace as at
from arttrace.testing import HFChatTokenizer, Reply, ScriptedLLM, ToolCall, serve
from support.qwen import qwen_tokenizer

MODEL = "qwen2.5-policy"
TOOL_CALL, IM_END = 151657, 151645
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    }
]
QUESTION = "What is the weather in Paris right now? Answer in one sentence."
SUMMARISER = "Summarise the user's question and the answer in at most eight words."


@dataclass(frozen=True)
class Rollout:
    """What the scripted model does in one run of the example, and the run's reward."""

    reward: float
    arguments: dict[str, Any]
    tool_result: str
    answer: str
    summary: str
    preamble: str | None = None
    """Text the model writes before its tool call."""
    streamed_turn: int = 0
    """Which policy turn (0: the tool call, 1: the answer) the agent streams."""


ROLLOUTS = [
    Rollout(
        1.0,
        {"city": "Paris"},
        "sunny, 22°C",
        "It is sunny and 22°C in Paris.",
        "Paris weather: sunny, 22°C.",
        streamed_turn=1,
    ),
    Rollout(
        0.0,
        {"city": "Paris", "unit": "fahrenheit"},
        "sunny, 72°F",
        "Paris is sunny (72°F).",
        "Asked Paris weather; sunny, 72°F.",
        preamble="Let me check the weather.",
        streamed_turn=0,
    ),
    # The group's mean reward: advantage 0, so ART leaves this run out.
    Rollout(
        0.5,
        {"city": "Paris, France"},
        "light rain, 14°C",
        "Light rain in Paris, 14°C.",
        "Paris: light rain, 14°C.",
        streamed_turn=1,
    ),
]


@dataclass
class Run:
    """One rollout as the agent saw it."""

    rollout: Rollout
    trajectory: at.Trajectory
    messages: list[dict[str, Any]] = field(default_factory=list)
    """The policy conversation, final answer included."""
    seen_logprobs: list[list[float]] = field(default_factory=list)
    """Per policy turn, the logprobs the SDK handed to the agent."""
    summary_messages: list[dict[str, Any]] = field(default_factory=list)


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def qwen() -> Any:
    return qwen_tokenizer()


@pytest.fixture
def instrumented() -> Iterator[None]:
    at.instrument()
    yield
    at.uninstrument()


@pytest.fixture
def runs(qwen: Any, instrumented: None) -> list[Run]:
    """The three rollouts of example ``ex-1``, run against the scripted Qwen server."""
    script: list[Reply] = []
    for r in ROLLOUTS:
        script += [
            Reply(r.preamble, tool_calls=[ToolCall("get_weather", r.arguments)]),
            Reply(r.answer),
            Reply(r.summary),
        ]
    llm = ScriptedLLM(script, tokenizer=HFChatTokenizer(qwen))
    with serve(llm) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0)
        out = []
        for number, rollout in enumerate(ROLLOUTS):
            with at.trajectory("ex-1", metadata={"rollout": number}) as t:
                run = Run(rollout, t)
                answer_weather(client, run)
                summarise(client, run)
                t.reward = rollout.reward
            out.append(run)
    assert len(llm.requests) == 3 * len(ROLLOUTS)
    return out


# -- the agent -----------------------------------------------------------------------------


@at.trainable
def answer_weather(client: openai.OpenAI, run: Run) -> None:
    """A tool-calling agent: the model asks for the weather, gets it, and answers."""
    run.messages = [{"role": "user", "content": QUESTION}]
    turn = policy_turn(client, run, stream=run.rollout.streamed_turn == 0)
    run.messages.append(turn)
    for call in turn["tool_calls"]:
        assert json.loads(call["function"]["arguments"]) == run.rollout.arguments
        run.messages.append(
            {"role": "tool", "tool_call_id": call["id"], "content": run.rollout.tool_result}
        )
    run.messages.append(policy_turn(client, run, stream=run.rollout.streamed_turn == 1))
    assert run.messages[-1] == {"role": "assistant", "content": run.rollout.answer}


def policy_turn(client: openai.OpenAI, run: Run, *, stream: bool) -> dict[str, Any]:
    """One model call; returns the assistant message to append, as an agent would."""
    request: dict[str, Any] = {"model": MODEL, "messages": run.messages, "tools": TOOLS}
    if not stream:
        choice = client.chat.completions.create(**request).choices[0]
        assert choice.logprobs is not None and choice.logprobs.content is not None
        run.seen_logprobs.append([t.logprob for t in choice.logprobs.content])
        message: dict[str, Any] = {"role": "assistant", "content": choice.message.content}
        if choice.message.tool_calls:
            message["tool_calls"] = [
                tc.model_dump(exclude_none=True) for tc in choice.message.tool_calls
            ]
        return message
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    logprobs: list[float] = []
    for chunk in client.chat.completions.create(**request, stream=True):
        for part in chunk.choices:
            if part.logprobs is not None and part.logprobs.content:
                logprobs += [t.logprob for t in part.logprobs.content]
            content.append(part.delta.content or "")
            for tc in part.delta.tool_calls or ():
                empty = {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                slot = calls.setdefault(tc.index, empty)
                slot["id"] += tc.id or ""
                if tc.function is not None:
                    slot["function"]["name"] += tc.function.name or ""
                    slot["function"]["arguments"] += tc.function.arguments or ""
    run.seen_logprobs.append(logprobs)
    message = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [calls[k] for k in sorted(calls)]
    return message


def summarise(client: openai.OpenAI, run: Run) -> None:
    """Context only: not @trainable, its own conversation, and it even asks for token ids."""
    run.summary_messages = [
        {"role": "system", "content": SUMMARISER},
        {"role": "user", "content": f"Q: {QUESTION}\nA: {run.messages[-1]['content']}"},
    ]
    response = client.chat.completions.create(
        model=MODEL,
        messages=run.summary_messages,
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    assert response.choices[0].message.content == run.rollout.summary


# -- helpers -------------------------------------------------------------------------------


def tokenize(qwen: Any, *groups: list[art.Trajectory]) -> list[TokenizedResult]:
    return list(
        tokenize_trajectory_groups(
            qwen,
            [art.TrajectoryGroup(group) for group in groups],
            allow_training_without_logprobs=False,
            scale_rewards=True,
        )
    )


def by_rollout(results: list[TokenizedResult]) -> dict[int, list[TokenizedResult]]:
    out: dict[int, list[TokenizedResult]] = {}
    for result in results:
        out.setdefault(int(result.trajectory.metadata["rollout"]), []).append(result)
    return out


def advantage(reward: float) -> float:
    """GRPO's advantage over ROLLOUTS, as ART computes it with ``scale_rewards=True``."""
    rewards = [r.reward for r in ROLLOUTS]
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    return (reward - mean) / std


def policy_choices(trajectory: art.Trajectory) -> list[Choice]:
    return [item for item in trajectory.messages_and_choices if isinstance(item, Choice)]


def masked(result: TokenizedResult) -> tuple[list[int], list[float]]:
    """The tokens (and their logprobs) ART trains on."""
    keep = [i for i, m in enumerate(result.assistant_mask) if m]
    return [result.token_ids[i] for i in keep], [result.logprobs[i] for i in keep]


def contains_run(haystack: list[int], needle: list[int]) -> bool:
    n = len(needle)
    return any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


def same_floats(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(
        (math.isnan(x) and math.isnan(y)) or x == y for x, y in zip(a, b, strict=True)
    )


def template_ids(qwen: Any, messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
    """Token ids of ``messages`` through Qwen's chat template, tool arguments as objects."""
    rendered = []
    for message in messages:
        message = dict(message)
        if message.get("tool_calls"):
            message["tool_calls"] = [
                {
                    **tc,
                    "function": {
                        **tc["function"],
                        "arguments": json.loads(tc["function"]["arguments"]),
                    },
                }
                for tc in message["tool_calls"]
            ]
        rendered.append({**message, "content": message.get("content") or ""})
    out = qwen.apply_chat_template(rendered, tokenize=True, **kwargs)
    return [int(i) for i in out["input_ids"]]


# -- tests ---------------------------------------------------------------------------------


def test_the_offline_tokenizer_is_qwen25(qwen: Any) -> None:
    ids = template_ids(
        qwen, [{"role": "user", "content": "Hello world"}], add_generation_prompt=True
    )
    assert ids == [
        151644,
        8948,
        198,
        2610,
        525,
        1207,
        16948,
        11,
        3465,
        553,
        54364,
        14817,
        13,
        1446,
        525,
        264,
        10950,
        17847,
        13,
        151645,
        198,
        151644,
        872,
        198,
        9707,
        1879,
        151645,
        198,
        151644,
        77091,
        198,
    ]
    assert qwen.eos_token_id == IM_END and qwen.pad_token_id == 151643
    assert qwen.convert_tokens_to_ids(["<tool_call>", "</tool_call>"]) == [TOOL_CALL, 151658]


def test_art_trains_exactly_the_policy_turns(qwen: Any, runs: list[Run]) -> None:
    trajectories = [run.trajectory.to_art() for run in runs]
    for run, trajectory in zip(runs, trajectories, strict=True):
        # the policy conversation: two Choices, the tool call first; the summariser apart
        choices = policy_choices(trajectory)
        assert len(choices) == 2
        assert choices[0].message.tool_calls and not choices[1].message.tool_calls
        assert [c.model_extra["token_ids"][-1] for c in choices] == [IM_END, IM_END]
        assert trajectory.tools == TOOLS
        assert len(trajectory.additional_histories) == 1
        summary = trajectory.additional_histories[0].messages_and_choices
        assert not any(isinstance(item, Choice) for item in summary)
        assert summary[-1] == {"role": "assistant", "content": run.rollout.summary}
        # the summariser's call did come back with token ids and logprobs: it is context by
        # choice (outside @trainable), not for lack of data
        context_call = next(c for c in run.trajectory.calls if not c.trainable)
        assert context_call.prompt_token_ids is not None
        assert context_call.choices[0].token_ids is not None
        assert context_call.choices[0].logprobs is not None

    results = by_rollout(tokenize(qwen, trajectories))

    # rewards 1.0, 0.0, 0.5: advantages ±1.22 and 0; the zero-advantage run is left out
    assert sorted(results) == [0, 1]
    for number, run in enumerate(runs):
        if number not in results:
            assert run.rollout.reward == sum(r.reward for r in ROLLOUTS) / len(ROLLOUTS)
            continue
        trajectory = trajectories[number]
        choices = policy_choices(trajectory)
        sequences = results[number]
        # both policy turns in ONE sequence: turn 2's prompt extends turn 1's prompt + sample.
        # After a preamble it does not, as with a real vLLM: hermes returns the text before
        # <tool_call> with its newline ("...weather.\n"), which Qwen's template renders back as
        # "...weather.\n\n<tool_call>"; ART then starts a second sequence (no turn is lost).
        split = run.rollout.preamble is not None
        assert len(sequences) == (2 if split else 1)
        for result in sequences:
            assert result.advantage == pytest.approx(advantage(run.rollout.reward), abs=1e-5)
        first_prompt, first_ids = (
            choices[0].model_extra[k] for k in ("prompt_token_ids", "token_ids")
        )
        second_prompt, second_ids = (
            choices[1].model_extra[k] for k in ("prompt_token_ids", "token_ids")
        )
        extends = second_prompt[: len(first_prompt) + len(first_ids)] == first_prompt + first_ids
        assert extends != split
        if split:
            # ART may order the two sequences either way
            assert sorted((r.token_ids, r.choice_offsets) for r in sequences) == sorted(
                [
                    (first_prompt + first_ids, [len(first_prompt)]),
                    (second_prompt + second_ids, [len(second_prompt)]),
                ]
            )
        else:
            (result,) = sequences
            assert result.token_ids == second_prompt + second_ids
            assert result.choice_offsets == [len(first_prompt), len(second_prompt)]
            # the sequence is the whole conversation through Qwen's template (minus the final
            # newline after <|im_end|>), i.e. what the model would see when trained on it
            whole = template_ids(qwen, run.messages, tools=TOOLS)
            assert whole[-1] == 198 and result.token_ids == whole[:-1]
        assert first_prompt == template_ids(
            qwen, run.messages[:1], tools=TOOLS, add_generation_prompt=True
        )

        # under the mask: exactly the sampled tokens of the two turns, with their logprobs
        in_order = sorted(sequences, key=lambda r: r.token_ids != first_prompt + first_ids)
        tokens = [t for r in in_order for t in masked(r)[0]]
        logprobs = [lp for r in in_order for lp in masked(r)[1]]
        assert tokens == first_ids + second_ids
        choice_logprobs = [t.logprob for c in choices for t in c.logprobs.content]
        assert logprobs == choice_logprobs
        assert logprobs == run.seen_logprobs[0] + run.seen_logprobs[1]
        assert all(
            math.isnan(lp)
            for r in sequences
            for lp, m in zip(r.logprobs, r.assistant_mask, strict=True)
            if not m
        )
        # the tool-call turn is trained, and it decodes to the Hermes tool call Qwen writes
        assert TOOL_CALL in tokens
        preamble = f"{run.rollout.preamble}\n" if run.rollout.preamble else ""
        call = json.dumps({"name": "get_weather", "arguments": run.rollout.arguments})
        assert qwen.decode(first_ids) == f"{preamble}<tool_call>\n{call}\n</tool_call><|im_end|>"
        assert qwen.decode(second_ids) == f"{run.rollout.answer}<|im_end|>"

        # the summariser's sampled tokens are nowhere in the training data
        context_call = next(c for c in run.trajectory.calls if not c.trainable)
        summary_ids = context_call.choices[0].token_ids.tolist()[:-1]  # without <|im_end|>
        assert summary_ids
        assert not any(contains_run(r.token_ids, summary_ids) for r in sequences)
        assert not contains_run(tokens, summary_ids)


def test_equal_rewards_give_no_training_data(qwen: Any, runs: list[Run]) -> None:
    for run in runs:
        run.trajectory.reward = 1.0
    assert tokenize(qwen, [run.trajectory.to_art() for run in runs]) == []
    # the same runs train as soon as their rewards differ
    runs[0].trajectory.reward = 0.0
    sequences = tokenize(qwen, [run.trajectory.to_art() for run in runs])
    assert len(sequences) == len(runs) + 1  # the preamble run is two (see the test above)


def test_saved_trajectories_tokenize_the_same(qwen: Any, runs: list[Run], tmp_path: Path) -> None:
    loaded = []
    for number, run in enumerate(runs):
        path = tmp_path / f"rollout-{number}.json"
        run.trajectory.save(path)
        loaded.append(at.Trajectory.load(path))

    before = [run.trajectory.to_art() for run in runs]
    after = [t.to_art() for t in loaded]
    for original, reloaded in zip(before, after, strict=True):
        choices = policy_choices(reloaded)
        assert len(choices) == 2  # rebuilt as Choices: still trainable
        for a, b in zip(policy_choices(original), choices, strict=True):
            assert b.model_extra["prompt_token_ids"] == a.model_extra["prompt_token_ids"]
            assert b.model_extra["token_ids"] == a.model_extra["token_ids"]
            assert [t.logprob for t in b.logprobs.content] == [
                t.logprob for t in a.logprobs.content
            ]
        assert reloaded.reward == original.reward
        assert len(reloaded.additional_histories) == len(original.additional_histories)

    results_before, results_after = (
        by_rollout(tokenize(qwen, before)),
        by_rollout(tokenize(qwen, after)),
    )
    assert sorted(results_after) == sorted(results_before) == [0, 1]
    for number, expected in results_before.items():
        got = results_after[number]
        assert len(got) == len(expected) == (2 if ROLLOUTS[number].preamble else 1)
        for g, e in zip(got, expected, strict=True):
            assert g.token_ids == e.token_ids
            assert g.assistant_mask == e.assistant_mask
            assert same_floats(g.logprobs, e.logprobs)
            assert g.choice_offsets == e.choice_offsets
            assert g.advantage == e.advantage
