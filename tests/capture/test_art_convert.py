"""The Choices ``to_art()`` builds without validation are the objects validation would build.

``capture._art`` builds each trainable turn's per-token logprob objects directly. Every test
here holds its output against ``Choice.model_validate`` of the same data in plain form (what
``to_art`` did before), for turns captured over HTTP from the scripted vLLM-like server (whole,
streamed, tool calls, ``top_logprobs``) and for the record shapes only frameworks and saved
files produce (text tokens, alternatives, NaN and -inf logprobs), down to the nested types,
pydantic's bookkeeping and the extras ART's tokenizer reads; then ART's own serialisation of
the groups (``model_dump``, JSON, pickle).
"""

from __future__ import annotations

import math
import pickle
from array import array
from collections.abc import Callable, Iterator
from typing import Any

import art
import openai
import pytest
from art.preprocessing.vllm_tokens import choice_vllm_token_metadata
from art.trajectories import LegacyHistory
from openai.types.chat.chat_completion import Choice
from pydantic import BaseModel

import arttrace as at
from arttrace.capture._art import messages_and_choices
from arttrace.capture._conversations import Conversation, Turn
from arttrace.capture._records import ChoiceRecord, LLMCall
from arttrace.integrations._core import choice_record
from arttrace.testing import LLMServer, Reply, ScriptedLLM, ToolCall
from support.common import TOOLS

# -- the reference: what validation builds from the same data -------------------------------


def validated(turn: Turn) -> Choice:
    """The turn's Choice as ``Choice.model_validate`` builds it from plain data."""
    record, prompt = turn.choice, turn.call.prompt_token_ids
    assert record.logprobs is not None and record.token_ids is not None and prompt is not None
    tokens = record.tokens or [f"token_id:{i}" for i in record.token_ids]
    top = record.top_logprobs or [[] for _ in tokens]
    content = [
        {"token": token, "logprob": logprob, "bytes": None, "top_logprobs": alternatives}
        for token, logprob, alternatives in zip(tokens, record.logprobs, top, strict=True)
    ]
    return Choice.model_validate(
        {
            "index": record.index,
            "finish_reason": record.finish_reason,
            "message": record.message,
            "logprobs": {"content": content, "refusal": None},
            "prompt_token_ids": prompt.tolist(),
            "token_ids": record.token_ids.tolist(),
        }
    )


def assert_same(fast: Any, slow: Any, where: str = "choice") -> None:
    """``fast`` and ``slow`` are the same object graph: types, values (NaN equal to NaN),
    and for each pydantic model its field order, fields set, extras and private state."""
    assert type(fast) is type(slow), where
    if isinstance(slow, BaseModel):
        assert list(fast.__dict__) == list(slow.__dict__), where
        assert fast.model_fields_set == slow.model_fields_set, where
        assert type(fast.__pydantic_fields_set__) is set, where
        assert fast.__pydantic_private__ == slow.__pydantic_private__, where
        assert_same(fast.__pydantic_extra__, slow.__pydantic_extra__, f"{where}.<extra>")
        for name, value in slow.__dict__.items():
            assert_same(fast.__dict__[name], value, f"{where}.{name}")
    elif isinstance(slow, dict):
        assert list(fast) == list(slow), where
        for key, value in slow.items():
            assert_same(fast[key], value, f"{where}[{key!r}]")
    elif isinstance(slow, list):
        assert len(fast) == len(slow), where
        for n, (a, b) in enumerate(zip(fast, slow, strict=True)):
            assert_same(a, b, f"{where}[{n}]")
    elif isinstance(slow, float) and math.isnan(slow):
        assert math.isnan(fast), where
    else:
        assert fast == slow, where


def assert_equivalent(fast: Choice, slow: Choice) -> None:
    assert_same(fast, slow)
    assert fast.model_dump_json() == slow.model_dump_json()
    assert fast.model_dump_json(exclude_unset=True) == slow.model_dump_json(exclude_unset=True)
    assert choice_vllm_token_metadata(fast) == choice_vllm_token_metadata(slow) is not None
    assert_same(pickle.loads(pickle.dumps(fast)), slow, "pickled")


def trainable_turns(trajectory: at.Trajectory) -> list[Turn]:
    return [
        item
        for conversation in trajectory.conversations()
        for item in conversation.items
        if isinstance(item, Turn) and item.trainable
    ]


def choices(trajectory: art.Trajectory) -> list[Choice]:
    histories = [trajectory.messages_and_choices] + [
        h.messages_and_choices for h in trajectory.additional_histories
    ]
    return [item for history in histories for item in history if isinstance(item, Choice)]


def with_validated_choices(fast: art.Trajectory, turns: list[Turn]) -> art.Trajectory:
    """``fast`` with each Choice replaced by the validated Choice of the same turn."""
    slow = iter([validated(turn) for turn in turns])

    def swap(items: list[Any]) -> list[Any]:
        return [next(slow) if isinstance(item, Choice) else item for item in items]

    out = art.Trajectory(  # as to_art() builds it
        messages_and_choices=swap(fast.messages_and_choices),
        tools=fast.tools,
        additional_histories=[
            LegacyHistory(messages_and_choices=swap(h.messages_and_choices), tools=h.tools)
            for h in fast.additional_histories
        ],
        reward=fast.reward,
        metrics=fast.metrics,
        metadata=fast.metadata,
        logs=fast.logs,
    )
    out.__dict__["start_time"] = fast.start_time  # the clock's, not the conversion's
    assert next(slow, None) is None
    return out


# -- runs captured over HTTP ----------------------------------------------------------------


@at.trainable
def agent(client: openai.OpenAI, question: str, **request: Any) -> None:
    """Two policy turns, the tool call first; the second asks for ``request`` (streamed or
    with ``top_logprobs``); then a context-only call with logprobs of its own."""
    messages: list[Any] = [{"role": "user", "content": question}]
    tools: Any = TOOLS
    first = client.chat.completions.create(model="p", messages=messages, tools=tools)
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    messages += [
        first.choices[0].message,
        {"role": "tool", "tool_call_id": call.id, "content": "5"},
    ]
    final = client.chat.completions.create(model="p", messages=messages, tools=tools, **request)
    if request.get("stream"):
        for _ in final:
            pass


def summarise(client: openai.OpenAI) -> None:
    client.chat.completions.create(
        model="p",
        messages=[{"role": "user", "content": "Summarise."}],
        logprobs=True,
        extra_body={"return_token_ids": True},
    )


REQUESTS: list[dict[str, Any]] = [
    {},
    {"stream": True},
    {"logprobs": True, "top_logprobs": 3},
    {"stream": True, "logprobs": True, "top_logprobs": 2},
]


@pytest.fixture
def runs(
    instrumented: None, server: Callable[[ScriptedLLM], LLMServer]
) -> Iterator[list[at.Trajectory]]:
    def reply(request: dict[str, Any]) -> Reply:
        if request["messages"][-1]["role"] == "tool":
            return Reply("2 + 3 is 5, and that is the whole answer.")
        if len(request["messages"]) == 1 and request["messages"][0]["content"] == "Summarise.":
            return Reply("Added two numbers.")
        return Reply("Let me add.", tool_calls=[ToolCall("add", {"a": 2, "b": 3})])

    client = openai.OpenAI(
        base_url=server(ScriptedLLM(reply)).base_url, api_key="test", max_retries=0
    )
    out = []
    for number, request in enumerate(REQUESTS):
        with at.trajectory(f"ex-{number % 2}", metadata={"run": number}) as t:
            agent(client, "What is 2 + 3?", **request)
            summarise(client)
            t.reward = float(number)
        out.append(t)
    yield out
    client.close()


# -- tests ----------------------------------------------------------------------------------


def test_captured_turns_convert_to_what_validation_builds(runs: list[at.Trajectory]) -> None:
    for t in runs:
        turns = trainable_turns(t)
        built = choices(t.to_art())
        assert len(turns) == len(built) == 2
        for turn, fast in zip(turns, built, strict=True):
            assert_equivalent(fast, validated(turn))
    # the shapes these runs were meant to cover did reach the conversion
    finals = [trainable_turns(t)[1].choice for t in runs]
    assert [c.top_logprobs is not None for c in finals] == [False, False, True, True]
    assert all(len(alts) == 3 for alts in finals[2].top_logprobs or ())
    assert trainable_turns(runs[0])[0].choice.message["tool_calls"]
    assert all(c.tokens is None for c in finals)  # ids from the server: names made from them


@pytest.mark.parametrize(
    "logprobs",
    [
        [-0.25, -1.5, -0.0],
        [float("nan"), -math.inf, -3.0e-12],
    ],
    ids=["finite", "nan-and-inf"],
)
def test_framework_and_saved_records_convert_to_what_validation_builds(
    logprobs: list[float],
) -> None:
    """Records a framework builds (text tokens beside vLLM ids, alternatives) and records
    loaded from a saved run (NaN and -inf logprobs survive JSON as floats)."""
    alternatives = [
        {"token": "Hel", "logprob": -2.0, "top_logprobs": []},
        {"token": "Hi", "logprob": -2.5},
    ]
    from_framework = choice_record(
        {"role": "assistant", "content": "Hello there"},
        finish_reason="stop",
        logprobs=[
            {"token": text, "logprob": lp, "top_logprobs": alternatives}
            for text, lp in zip(["Hello", " there", "<|im_end|>"], logprobs, strict=True)
        ],
        token_ids=[9707, 1052, 151645],
    )
    saved = ChoiceRecord.from_dict(
        {
            "index": 1,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
                ],
            },
            "finish_reason": "tool_calls",
            "logprobs": logprobs,
            "token_ids": [151657, 5, 151658],
            "tokens": None,
            "top_logprobs": None,
        }
    )
    for record in (from_framework, saved):
        call = LLMCall("m", [], choices=[record], trainable=True)
        call.prompt_token_ids = array("q", [151644, 872, 198])
        turn = Turn(call, record)
        assert turn.trainable
        (built,) = messages_and_choices(Conversation([turn]))
        assert_equivalent(built, validated(turn))
    assert from_framework.tokens == ["Hello", " there", "<|im_end|>"]
    assert from_framework.top_logprobs is not None


def test_each_token_owns_its_state(runs: list[at.Trajectory]) -> None:
    """Nothing is shared between tokens: changing one (an attribute of its own, its
    alternatives) leaves the others as validation would have left them."""
    choice = choices(runs[0].to_art())[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    first, second = choice.logprobs.content[:2]
    first.note = "mine"  # type: ignore[attr-defined]  # an extra, as pydantic allows
    first.top_logprobs.append(second.top_logprobs.copy())  # type: ignore[arg-type]
    assert first.model_extra == {"note": "mine"} and "note" in first.model_fields_set
    assert second.model_extra == {} and "note" not in second.model_fields_set
    assert second.top_logprobs == []
    again = choices(runs[0].to_art())[0]
    assert again.logprobs is not None and again.logprobs.content is not None
    assert again.logprobs.content[0].model_extra == {}
    assert again.logprobs.content[0].top_logprobs == []


def test_groups_serialise_as_with_validated_choices(runs: list[at.Trajectory]) -> None:
    """What ART does with a group before a backend sees it: dump it (Python and JSON),
    validate it back, pickle it. Each gives what the same group of validated Choices gives."""
    fast = [t.to_art() for t in runs]
    slow = [with_validated_choices(a, trainable_turns(t)) for a, t in zip(fast, runs, strict=True)]
    fast_group, slow_group = art.TrajectoryGroup(fast), art.TrajectoryGroup(slow)

    assert_same(fast_group.model_dump(), slow_group.model_dump(), "model_dump")
    assert_same(fast_group.model_dump(mode="json"), slow_group.model_dump(mode="json"), "json dump")
    assert fast_group.model_dump_json() == slow_group.model_dump_json()
    reloaded = art.TrajectoryGroup.model_validate_json(fast_group.model_dump_json())
    assert reloaded.model_dump_json() == slow_group.model_dump_json()
    unpickled = pickle.loads(pickle.dumps(fast_group))
    assert_same(unpickled, pickle.loads(pickle.dumps(slow_group)), "unpickled group")
    assert unpickled.model_dump_json() == slow_group.model_dump_json()
    copied = fast_group.model_copy(deep=True)
    assert_same(copied, slow_group.model_copy(deep=True), "deep copy")
    for trajectory in fast:
        assert len(choices(trajectory)) == 2
        for choice in choices(trajectory):
            assert choice_vllm_token_metadata(choice) is not None
