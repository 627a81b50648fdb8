"""Token continuity on real chat templates: Qwen2.5's and Qwen3's, rendered by transformers
from tokenizers built offline. Each run is a conversation whose prompts are the template's
renderings and whose sampled ids are what the model sampled (the template's rendering of the
turn, or ids made to differ on purpose); the sequence count is held equal to ART's own
``tokenize_trajectory_groups`` on ``to_art()``'s output."""

from __future__ import annotations

import copy
import json
import warnings
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import art
import openai
import pytest
from art.preprocessing.tokenize import tokenize_trajectory_groups
from tokenizers import AddedToken

import arttrace as at
from arttrace.capture import _continuity, _warnings
from arttrace.capture._continuity import (
    RunContinuity,
    run_continuity,
    step_continuity,
    warn_continuity,
)
from arttrace.capture._records import ChoiceRecord, LLMCall
from arttrace.testing import Completion, HFChatTokenizer, LLMServer, Reply, ScriptedLLM
from support.common import TOOLS
from support.qwen import qwen_tokenizer

# Qwen/Qwen3-8B's tokenizer_config.json "chat_template" (the Qwen3 family shares it): an
# assistant turn before the last user query is rendered without its reasoning.
QWEN3_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""  # noqa: E501
QWEN3_TOKENS = ("<tool_response>", "</tool_response>", "<think>", "</think>")  # 151665-151668


@pytest.fixture(scope="module")
def qwen2() -> Any:
    return qwen_tokenizer()


@pytest.fixture(scope="module")
def qwen3(qwen2: Any) -> Any:
    """Qwen3's tokenizer: Qwen2.5's vocabulary and added tokens, four more, its template."""
    tokenizer = copy.deepcopy(qwen2)
    for content in QWEN3_TOKENS:
        tokenizer.add_tokens([AddedToken(content, special=False, normalized=False)])
    tokenizer.chat_template = QWEN3_TEMPLATE
    assert tokenizer.convert_tokens_to_ids(list(QWEN3_TOKENS)) == [151665, 151666, 151667, 151668]
    return tokenizer


@pytest.fixture(autouse=True)
def _fresh_warnings() -> Iterator[None]:
    _warnings.reset()
    yield
    _warnings.reset()


# -- building runs as a vLLM server renders and samples them ----------------------------------


def for_template(message: dict[str, Any]) -> dict[str, Any]:
    """A message as vLLM hands it to the template: tool-call arguments parsed from JSON."""
    out = dict(message)
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {
                **tc,
                "function": {
                    **tc["function"],
                    "arguments": json.loads(tc["function"]["arguments"]),
                },
            }
            for tc in message["tool_calls"]
        ]
    return out


def render(
    tokenizer: Any, messages: list[dict[str, Any]], generation: bool, tools: Any
) -> list[int]:
    out = tokenizer.apply_chat_template(
        [for_template(m) for m in messages],
        tools=tools,
        add_generation_prompt=generation,
        tokenize=True,
    )
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return [int(i) for i in ids]


class Run:
    """One run's calls: each turn's prompt is the template's rendering of the messages so far."""

    def __init__(self, tokenizer: Any, tools: Any = None) -> None:
        self.tokenizer, self.tools = tokenizer, tools
        self.calls: list[LLMCall] = []

    def turn(
        self,
        messages: list[dict[str, Any]],
        reply: dict[str, Any],
        *,
        sampled: list[int] | None = None,
        ids: bool = True,
        model: str = "policy",
    ) -> dict[str, Any]:
        """Record a call on ``messages`` answered by ``reply``; ``sampled``: the ids the model
        sampled (default: the template's rendering of ``reply`` as the last turn). Returns the
        message the agent gets back (the reasoning split off, as vLLM's parser does)."""
        prompt = render(self.tokenizer, messages, True, self.tools)
        if sampled is None:
            whole = render(self.tokenizer, [*messages, reply], False, self.tools)
            assert whole[: len(prompt)] == prompt
            end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
            rest = whole[len(prompt) :]
            sampled = rest[: rest.index(end) + 1]
        message = {k: v for k, v in reply.items() if k != "reasoning_content"}
        if "reasoning_content" in reply:
            message["reasoning"] = reply["reasoning_content"]
        choice = ChoiceRecord(
            0,
            message,
            "tool_calls" if reply.get("tool_calls") else "stop",
            logprobs=array("d", [-0.5] * len(sampled)) if ids else None,
            token_ids=array("q", sampled) if ids else None,
        )
        self.calls.append(
            LLMCall(
                model,
                [dict(m) for m in messages],
                self.tools,
                choices=[choice],
                prompt_token_ids=array("q", prompt) if ids else None,
                trainable=True,
            )
        )
        return message

    def trajectory(self, reward: float = 1.0, name: str = "r") -> at.Trajectory:
        t = at.Trajectory(name)
        t.call_log.records = list(self.calls)
        t.reward = reward
        return t


def art_sequences(tokenizer: Any, *runs: at.Trajectory) -> list[int]:
    """How many sequences ART's own tokenizer trains each run as (each paired with a copy that
    differs in reward, so that no run has an advantage of 0)."""
    counts = []
    for run in runs:
        ours, other = run.to_art(), run.to_art()
        other.reward = ours.reward - 1.0
        results = tokenize_trajectory_groups(
            tokenizer,
            [art.TrajectoryGroup([ours, other])],
            allow_training_without_logprobs=False,
            scale_rewards=True,
        )
        counts.append(sum(1 for r in results if r.trajectory is ours))
    return counts


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(content: str | None, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, **extra}


def tool_call(arguments: str) -> dict[str, Any]:
    return {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": arguments}}


# -- runs without a break ----------------------------------------------------------------------


def test_a_qwen2_tool_run_extends_its_ids_and_trains_as_one_sequence(qwen2: Any) -> None:
    run = Run(qwen2, TOOLS)
    history = [{"role": "system", "content": "You add."}, user("What is 2+3?")]
    history.append(run.turn(history, assistant(None, tool_calls=[tool_call('{"a": 2, "b": 3}')])))
    history.append({"role": "tool", "tool_call_id": "call_1", "content": "5"})
    history.append(run.turn(history, assistant("It is 5.")))
    history.append(user("And 5+5?"))
    run.turn(history, assistant("It is 10."))
    t = run.trajectory()
    found = run_continuity(t)
    assert (found.boundaries, found.breaks, found.unknown_turns) == (2, (), 0)
    assert found.break_rate == 0.0 and found.sequences == 1 == found.conversations
    assert art_sequences(qwen2, t) == [1]
    metadata = t.to_art().metadata
    assert metadata["continuity_breaks"] == 0 and metadata["art_sequences"] == 1
    assert metadata["continuity_boundaries"] == 2 and metadata["example_id"] == "r"


def test_a_qwen3_tool_run_that_sends_its_reasoning_back_has_no_break(qwen3: Any) -> None:
    """Qwen3 keeps the reasoning of assistant turns after the last user query when the agent
    sends it back (``reasoning_content``)."""
    run = Run(qwen3, TOOLS)
    history = [user("What is 2+3?")]
    reply = assistant(
        "", reasoning_content="I add them.", tool_calls=[tool_call('{"a": 2, "b": 3}')]
    )
    run.turn(history, reply)
    history += [reply, {"role": "tool", "tool_call_id": "call_1", "content": "5"}]
    run.turn(history, assistant("It is 5.", reasoning_content="The tool said 5."))
    t = run.trajectory()
    found = run_continuity(t)
    assert qwen3.decode(t.calls[0].choices[0].token_ids).startswith("<think>\nI add them.")
    assert (found.boundaries, found.breaks, found.sequences) == (1, (), 1)
    assert art_sequences(qwen3, t) == [1]


# -- breaks made on purpose ----------------------------------------------------------------------


def test_qwen3_dropping_earlier_reasoning_is_a_template_break(qwen3: Any) -> None:
    """After a new user message Qwen3's template renders the earlier turn without its
    ``<think>`` block: the prompt no longer holds the ids the model sampled."""
    run = Run(qwen3)
    history = [user("What is 2+3?")]
    history.append(run.turn(history, assistant("It is 5.", reasoning_content="2 and 3 make 5.")))
    history.append(user("And 5+5?"))
    run.turn(history, assistant("It is 10.", reasoning_content="5 and 5 make 10."))
    t = run.trajectory()
    found = run_continuity(t)
    (brk,) = found.breaks
    assert (brk.cause, brk.decided_by, brk.conversation, brk.turn) == ("template", "ids", 0, 1)
    first = t.calls[0]
    assert first.prompt_token_ids is not None and brk.position == len(first.prompt_token_ids)
    assert found.break_rate == 1.0 and found.counts() == {
        "template": 1,
        "retokenized": 0,
        "other": 0,
    }
    assert found.sequences == 2 and art_sequences(qwen3, t) == [2]
    # Ids removed outright change the text: no tokenizer is needed to know it.
    (with_tokenizer,) = run_continuity(t, tokenizer=qwen3).breaks
    assert (with_tokenizer.cause, with_tokenizer.decided_by) == ("template", "ids")
    assert "<think>" in qwen3.decode(t.calls[0].choices[0].token_ids)


def test_the_documented_fix_keeps_a_qwen3_run_whole(qwen3: Any) -> None:
    """docs/continuity.md's fix for Qwen3: ART's template rewrite keeps every turn's
    reasoning, and the agent sends it back: the same run as above has no break."""
    from art_inference.chat_template import chat_template_with_preserved_thinking

    keeping = copy.copy(qwen3)
    keeping.chat_template = chat_template_with_preserved_thinking(QWEN3_TEMPLATE)
    run = Run(keeping)
    history = [user("What is 2+3?")]
    history.append(run.turn(history, assistant("It is 5.", reasoning_content="2 and 3 make 5.")))
    history.append(user("And 5+5?"))
    run.turn(history, assistant("It is 10.", reasoning_content="5 and 5 make 10."))
    t = run.trajectory()
    found = run_continuity(t)
    assert (found.boundaries, found.breaks, found.sequences) == (1, (), 1)
    assert art_sequences(keeping, t) == [1]


def test_an_agent_that_drops_the_reasoning_breaks_a_qwen3_tool_run(qwen3: Any) -> None:
    run = Run(qwen3, TOOLS)
    history = [user("What is 2+3?")]
    got = run.turn(
        history,
        assistant("", reasoning_content="I add.", tool_calls=[tool_call('{"a": 2, "b": 3}')]),
    )
    assert got["reasoning"] == "I add."  # what vLLM's reasoning parser returns, the agent drops
    dropped = {k: v for k, v in got.items() if k != "reasoning"}
    history += [dropped, {"role": "tool", "tool_call_id": "call_1", "content": "5"}]
    run.turn(history, assistant("It is 5."))
    t = run.trajectory()
    ((cause, by),) = [(b.cause, b.decided_by) for b in run_continuity(t).breaks]
    assert (cause, by) == ("template", "ids")
    assert run_continuity(t).sequences == 2 == art_sequences(qwen3, t)[0]


def test_a_re_serialised_tool_call_is_a_template_break(qwen2: Any) -> None:
    """The model wrote compact JSON; Qwen2.5's template writes the arguments back with
    ``tojson`` (spaces after ``:`` and ``,``)."""
    run = Run(qwen2, TOOLS)
    history = [user("What is 2+3?")]
    sampled_text = (
        '<tool_call>\n{"name": "add", "arguments": {"a":2,"b":3}}\n</tool_call><|im_end|>'
    )
    sampled = qwen2.encode(sampled_text, add_special_tokens=False)
    history.append(
        run.turn(history, assistant(None, tool_calls=[tool_call('{"a":2,"b":3}')]), sampled=sampled)
    )
    history.append({"role": "tool", "tool_call_id": "call_1", "content": "5"})
    run.turn(history, assistant("It is 5."))
    t = run.trajectory()
    assert [(b.cause, b.decided_by) for b in run_continuity(t).breaks] == [("template", "guess")]
    assert [(b.cause, b.decided_by) for b in run_continuity(t, qwen2).breaks] == [
        ("template", "text")
    ]
    assert run_continuity(t).sequences == 2 == art_sequences(qwen2, t)[0]


def test_sampled_text_retokenised_to_other_ids_is_a_retokenized_break(qwen2: Any) -> None:
    """The model sampled "Hello" as "Hel" + "lo"; the server re-tokenises the same text as one
    token when it renders the history."""
    run = Run(qwen2)
    history = [user("Greet me.")]
    encode = lambda text: qwen2.encode(text, add_special_tokens=False)  # noqa: E731
    sampled = [
        *encode("Hel"),
        *encode("lo"),
        *encode(" world"),
        qwen2.convert_tokens_to_ids("<|im_end|>"),
    ]
    assert encode("Hello world") == [9707, 1879] and len(sampled) == 4
    history.append(run.turn(history, assistant("Hello world"), sampled=sampled))
    history.append(user("Again."))
    run.turn(history, assistant("Hello world"))
    t = run.trajectory()
    assert [(b.cause, b.decided_by) for b in run_continuity(t).breaks] == [("retokenized", "guess")]
    assert [(b.cause, b.decided_by) for b in run_continuity(t, qwen2).breaks] == [
        ("retokenized", "text")
    ]
    assert run_continuity(t).sequences == 2 == art_sequences(qwen2, t)[0]


def test_the_models_tokenizer_on_this_machine_decides_without_being_given(
    qwen2: Any, tmp_path: Path
) -> None:
    """A run whose model names a local tokenizer folder (as vLLM serves a local model): the
    check finds and loads it offline (the viewer's lookup) and compares texts."""
    folder = tmp_path / "qwen2.5"
    folder.mkdir()
    qwen2.backend_tokenizer.save(str(folder / "tokenizer.json"))
    run = Run(qwen2)
    history = [user("Greet me.")]
    sampled = [32713, 385, 1879, 151645]  # "Hel", "lo", " world", "<|im_end|>"
    assert qwen2.decode(sampled) == "Hello world<|im_end|>"
    history.append(run.turn(history, assistant("Hello world"), sampled=sampled, model=str(folder)))
    history.append(user("Again."))
    run.turn(history, assistant("Hello world"), model=str(folder))
    t = run.trajectory()
    assert [(b.cause, b.decided_by) for b in run_continuity(t).breaks] == [("retokenized", "text")]


def test_a_changed_earlier_message_is_an_other_break(qwen2: Any) -> None:
    """The agent sends the first question back without its trailing newline: the same
    conversation to arttrace (whitespace aside), other ids before any assistant turn."""
    run = Run(qwen2)
    history = [user("What is 2+3?\n")]
    answer = run.turn(history, assistant("5"))
    history = [user("What is 2+3?"), answer, user("And 5+5?")]
    run.turn(history, assistant("10"))
    t = run.trajectory()
    found = run_continuity(t)
    assert len(t.conversations()) == 1 and found.boundaries == 1
    ((cause, position),) = [(b.cause, b.position) for b in found.breaks]
    first = t.calls[0].prompt_token_ids
    assert cause == "other" and first is not None and position < len(first)
    assert found.sequences == 2 == art_sequences(qwen2, t)[0]


def test_sub_agents_are_their_own_conversations_and_turns_without_ids_are_unknown(
    qwen2: Any,
) -> None:
    run = Run(qwen2)
    main = [{"role": "system", "content": "You plan."}, user("Plan a trip.")]
    main.append(run.turn(main, assistant("Step 1: pack.")))
    helper = [{"role": "system", "content": "You summarise."}, user("Summarise: pack.")]
    helper.append(run.turn(helper, assistant("Pack.")))
    main.append(user("Next?"))
    main.append(run.turn(main, assistant("Step 2: go."), ids=False))  # the server sent no ids
    main.append(user("Then?"))
    run.turn(main, assistant("Step 3: rest."))
    helper.append(user("Shorter."))
    run.turn(helper, assistant("Go."))
    t = run.trajectory()
    found = run_continuity(t)
    # main: turns 1 and 3 checked (turn 2 unknown), helper: its two turns; no break anywhere.
    assert (found.boundaries, len(found.breaks), found.unknown_turns) == (2, 0, 1)
    assert found.conversations == 2 and found.sequences == 2
    assert art_sequences(qwen2, t) == [2]


def test_a_branch_of_n_2_is_its_own_sequence_as_in_art(qwen2: Any) -> None:
    """With ``n=2`` the second choice branches off (an additional history whose shared prefix
    is context): its prompt is the first choice's, not an extension of what came before."""
    run = Run(qwen2)
    history = [user("Name a colour.")]
    first = run.turn(history, assistant("Red."))
    call = run.calls[-1]
    other = [*qwen2.encode("Blue.", add_special_tokens=False), 151645]
    call.choices.append(
        ChoiceRecord(
            1, assistant("Blue."), "stop", array("d", [-0.5] * len(other)), array("q", other)
        )
    )
    history += [first, user("Another?")]
    run.turn(history, assistant("Green."))
    t = run.trajectory()
    found = run_continuity(t)
    assert len(t.conversations()) == 2 and found.boundaries == 1 and found.breaks == ()
    assert found.sequences == 2 == found.conversations
    assert art_sequences(qwen2, t) == [2]


# -- an agent that edits earlier messages ------------------------------------------------------

SYSTEM = "You add numbers with the add tool, one step at a time."
TASK = "What is 1+2+3+4?"


def tool_agent(run: Run, edit: Any, turns: int = 3) -> list[dict[str, Any]]:
    """A tool loop of ``turns`` calls (tool calls, then the answer) whose agent sends
    ``edit(history, i)`` at call ``i`` in place of its history. Returns the history."""
    history = [{"role": "system", "content": SYSTEM}, user(TASK)]
    for i in range(turns):
        last = i == turns - 1
        reply = (
            assistant("It is 10.")
            if last
            else assistant(None, tool_calls=[tool_call(f'{{"a": {i}, "b": 1}}')])
        )
        got = run.turn(edit(copy.deepcopy(history), i), reply)
        history.append(got)
        if not last:
            history.append({"role": "tool", "tool_call_id": "call_1", "content": f"{i + 1}"})
    return history


def timestamp(history: list[dict[str, Any]], i: int) -> list[dict[str, Any]]:
    history[0]["content"] = f"{SYSTEM} The time is 12:{i:02d}."
    return history


def tries_left(history: list[dict[str, Any]], i: int) -> list[dict[str, Any]]:
    history[1]["content"] = f"{TASK} ({9 - i} tries left)"
    return history


def older_results_cut(history: list[dict[str, Any]], i: int) -> list[dict[str, Any]]:
    tools = [m for m in history if m["role"] == "tool"]
    for m in tools[:-1]:
        m["content"] = "(cut)"
    return history


def trimmed(history: list[dict[str, Any]], i: int) -> list[dict[str, Any]]:
    return history[:2] + history[-2:] if len(history) > 4 else history


@pytest.mark.parametrize(
    ("edit", "kind", "breaks"),
    [
        (timestamp, "system", [1, 2]),
        (tries_left, "user", [1, 2]),
        (older_results_cut, "tool", [2]),  # call 1 has one result: nothing cut yet
        (trimmed, "trimmed", [2]),  # call 2 drops the first tool call and its result
    ],
)
def test_an_edited_earlier_message_continues_the_conversation_with_an_other_break(
    qwen2: Any, edit: Any, kind: str, breaks: list[int]
) -> None:
    """The agent changes an earlier message between calls: each such call extends no
    conversation, yet it is the same agent carrying on (it sends back its latest turn).
    Each change is a boundary and an ``other`` break, the edit named; ART's count agrees."""
    run = Run(qwen2, TOOLS)
    tool_agent(run, edit)
    t = run.trajectory()
    found = run_continuity(t)
    assert found.conversations == 1 and found.boundaries == 2
    assert [(b.turn, b.cause, b.decided_by, b.edit) for b in found.breaks] == [
        (0, "other", "messages", kind) for _ in breaks
    ]
    assert found.sequences == 1 + len(breaks) == art_sequences(qwen2, t)[0]
    metadata = t.to_art().metadata
    assert metadata["continuity_breaks_other"] == len(breaks)
    assert metadata[f"continuity_edits_{kind}"] == len(breaks)
    assert metadata["continuity_conversations"] == 1


def test_a_ten_turn_agent_with_a_timestamp_breaks_at_every_turn(qwen2: Any) -> None:
    """The issue's agent: a timestamp in the system prompt, ten turns: ART trains ten
    sequences, each repeating the history; the rate says so (it said 0)."""
    run = Run(qwen2, TOOLS)
    tool_agent(run, timestamp, turns=10)
    t = run.trajectory()
    found = run_continuity(t)
    assert (found.boundaries, len(found.breaks), found.break_rate) == (9, 9, 1.0)
    assert {b.edit for b in found.breaks} == {"system"} and found.conversations == 1
    assert found.sequences == 10 == art_sequences(qwen2, t)[0]
    main, *others = t.conversations()
    assert main.items[-1].choice.message["content"] == "It is 10."  # the final answer's
    assert len(others) == 9 and len(main.timeline()) == 2 + 9 * 2 + 1


def test_reasoning_the_agent_strips_from_its_own_turn_is_an_assistant_edit(qwen3: Any) -> None:
    """No reasoning parser: the model's ``<think>`` block comes back in the content, and the
    agent strips it before sending the turn back. Qwen3 would have kept it (a tool loop)."""
    run = Run(qwen3, TOOLS)
    history = [user("What is 2+3?")]
    got = run.turn(
        history,
        assistant("<think>\nI add.\n</think>\n\n", tool_calls=[tool_call('{"a": 2, "b": 3}')]),
    )
    sampled = run.calls[0].choices[0].token_ids
    assert sampled is not None and "<think>" in qwen3.decode(sampled)
    history += [
        {**got, "content": ""},  # stripped by the agent
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]
    run.turn(history, assistant("It is 5."))
    t = run.trajectory()
    found = run_continuity(t)
    assert [(b.cause, b.decided_by, b.edit) for b in found.breaks] == [
        ("other", "messages", "assistant")
    ]
    assert found.conversations == 1 and found.sequences == 2 == art_sequences(qwen3, t)[0]


def test_an_agent_that_rewrites_its_own_turn_continues_with_an_assistant_edit(
    qwen2: Any,
) -> None:
    """A ReAct agent re-renders its action before sending it back (the input as a Python
    dict): the turn is not sent back, but the history before it is, with an assistant message
    in its place."""
    run = Run(qwen2)
    history = [{"role": "system", "content": "Answer with actions."}, user("What is 5+6?")]
    run.turn(history, assistant('Action: add {"a": 5, "b": 6}'))
    history += [assistant("Action: add {'a': 5, 'b': 6}"), user("Observation: 11")]
    run.turn(history, assistant("Answer: 11"))
    t = run.trajectory()
    found = run_continuity(t)
    assert [(b.cause, b.edit) for b in found.breaks] == [("other", "assistant")]
    assert found.conversations == 1 and found.sequences == 2 == art_sequences(qwen2, t)[0]


def test_separate_conversations_stay_separate(qwen2: Any) -> None:
    """Not continuations: a critic with its own system prompt given the agent's history, a
    sub-agent asked again with another task, and a fresh attempt (a new timestamp, without
    the earlier answer). No boundary among them, as ART trains them: one sequence each."""
    run = Run(qwen2)
    main = [{"role": "system", "content": f"{SYSTEM} The time is 12:00."}, user(TASK)]
    main.append(run.turn(main, assistant("It is 10.")))
    critic = [{"role": "system", "content": "You critique answers."}, *main[1:]]
    run.turn([*critic, user("Is it right?")], assistant("Yes."))
    summary = {"role": "system", "content": "You summarise."}
    run.turn([summary, user("Summarise: 1+2.")], assistant("Three."))
    run.turn([summary, user("Summarise: 3+4.")], assistant("Seven."))
    retry = [{"role": "system", "content": f"{SYSTEM} The time is 12:05."}, user(TASK)]
    run.turn(retry, assistant("Ten."))
    t = run.trajectory()
    found = run_continuity(t)
    assert (found.boundaries, found.breaks, found.conversations) == (0, (), 5)
    assert all(c.continues is None for c in t.conversations())
    assert found.sequences == 5 == art_sequences(qwen2, t)[0]


def planner_then_agent(qwen2: Any, answer: str, turns: int = 6) -> at.Trajectory:
    """A planner called first, then the timestamped tool agent, then notes written."""
    run = Run(qwen2, TOOLS)
    run.turn([{"role": "system", "content": "You plan."}, user("Plan the sum.")], assistant("Add."))
    tool_agent(run, timestamp, turns=turns)
    run.calls[-1].choices[0].message["content"] = answer
    run.turn([user("Write notes.")], assistant("Notes."))
    return run.trajectory()


def test_the_main_conversation_is_the_final_answers_and_ruler_shows_it_once(qwen2: Any) -> None:
    """A planner is called first, notes are written last, and the agent's timestamp makes
    each call a conversation of its own: the run's output is still its final answer, and the
    judge reads the agent's conversation once (each tool result once), not the history once
    per turn."""
    from arttrace.rewards._ruler import render
    from arttrace.training._group import Group, GroupRun

    runs = [planner_then_agent(qwen2, "It is 10."), planner_then_agent(qwen2, "It is 11.")]
    group = Group("e", {}, 0, tuple(GroupRun(k, t, 1.0) for k, t in enumerate(runs)))
    assert [run.output for run in group.runs] == ["It is 10.", "It is 11."]
    text = render(group, ["1", "2"])
    assert text.count('"content":"1"') == 1  # the first tool result: once, shared
    assert text.count('"content":"5"') == 1  # the last: once too (the runs differ after it)
    assert text.count(TASK) == 1 and text.count("Plan the sum.") == 2
    assert text.count('kind="main"') == 2 and text.count('kind="other"') == 4  # planner, notes
    main, planner, notes = text.split('<run id="1">')[1].split("</run>")[0].split('kind="other"')
    assert "It is 10." in main and "Add." in planner and "Notes." in notes


# -- a step -------------------------------------------------------------------------------------


def three_runs(qwen2: Any, qwen3: Any) -> list[at.Trajectory]:
    """No break (reward 1), a template break (0), a retokenized break (0.5: the group's mean,
    so ART trains it not at all)."""
    clean = Run(qwen2)
    history = [user("Hi.")]
    history += [clean.turn(history, assistant("Hello.")), user("Bye.")]
    clean.turn(history, assistant("Bye."))
    thinking = Run(qwen3)
    history = [user("Hi.")]
    history += [
        thinking.turn(history, assistant("Hello.", reasoning_content="Greet.")),
        user("Bye."),
    ]
    thinking.turn(history, assistant("Bye."))
    split = Run(qwen2)
    history = [user("Hi.")]
    ids = [
        *qwen2.encode("Hel", add_special_tokens=False),
        *qwen2.encode("lo.", add_special_tokens=False),
    ]
    history += [split.turn(history, assistant("Hello."), sampled=[*ids, 151645]), user("Bye.")]
    split.turn(history, assistant("Bye."))
    return [
        clean.trajectory(1.0, "clean"),
        thinking.trajectory(0.0, "thinking"),
        split.trajectory(0.5, "split"),
    ]


def test_step_metrics_sum_the_runs_and_count_sequences_as_art_does(qwen2: Any, qwen3: Any) -> None:
    runs = three_runs(qwen2, qwen3)
    group = art.TrajectoryGroup([t.to_art() for t in runs])
    metrics = step_continuity([group])
    assert metrics == {
        "continuity_break_rate": 2 / 3,
        "continuity_boundaries": 3,
        "continuity_breaks": 2,
        "continuity_breaks_template": 1,
        "continuity_breaks_retokenized": 1,
        "continuity_breaks_other": 0,
        "continuity_breaks_guessed": 1,  # split's: no tokenizer given, the message decided
        **{f"continuity_edits_{e}": 0 for e in ("system", "user", "assistant", "tool", "trimmed")},
        "continuity_unknown_turns": 0,
        # Over the runs ART trains, both: split's advantage is 0.
        "continuity_conversations": 2,  # clean 1 + thinking 1
        "art_sequences": 3,  # clean 1 + thinking 2
    }
    trained = list(
        tokenize_trajectory_groups(
            qwen2, [group], allow_training_without_logprobs=False, scale_rewards=True
        )
    )
    assert len(trained) == metrics["art_sequences"]
    # Runs given one by one (not as a group) count every run's sequences.
    loose = step_continuity([*group.trajectories])
    assert loose["art_sequences"] == 5 and loose["continuity_breaks"] == 2
    assert loose["continuity_conversations"] == 3
    assert step_continuity(runs) == loose == step_continuity([run_continuity(t) for t in runs])
    assert step_continuity([])["continuity_break_rate"] == 0.0


def test_a_step_above_the_threshold_warns_once_with_cause_and_fix(qwen2: Any, qwen3: Any) -> None:
    runs = three_runs(qwen2, qwen3)[:2]
    metrics = step_continuity(runs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert warn_continuity(4, metrics) is True
        assert warn_continuity(4, metrics, threshold=0.6) is False  # 1 of 2 is 50 %
    (warning,) = caught
    assert warning.category is at.TokenContinuityWarning
    message = str(warning.message)
    assert "step 4: 1 of 2 turn boundaries (50%, above 5%)" in message
    assert "(the runs ART trains: 3 sequences for 2 conversations)" in message
    assert "Most common cause: template (1 of 1" in message
    assert "keep the reasoning of earlier turns" in message  # the fix
    assert _continuity.DOCS in message and (Path(__file__).parents[2] / _continuity.DOCS).is_file()
    assert warning.filename == __file__  # points at the caller, not at arttrace


def test_unchecked_turns_are_named_in_the_warning() -> None:
    found = RunContinuity(boundaries=1, breaks=(), unknown_turns=3, conversations=1, sequences=1)
    metrics = {**step_continuity([found]), "continuity_breaks": 1.0, "continuity_breaks_other": 1.0}
    metrics["continuity_break_rate"] = 1.0
    with pytest.warns(at.TokenContinuityWarning, match="3 policy turns were not checked") as got:
        warn_continuity(0, metrics)
    assert "return_token_ids" in str(got[0].message) and "Most common cause: other" in str(
        got[0].message
    )


def test_a_step_of_agents_that_edit_their_history_warns_with_other_and_the_edit(
    qwen2: Any,
) -> None:
    """Four groups of timestamped agents: every boundary breaks, the warning says ``other``,
    names the system prompt, and compares sequences and conversations of the same runs (a
    run whose advantage is 0 left out of both, as ART leaves it out)."""
    groups = []
    for g in range(4):
        runs = []
        for k, reward in enumerate((0.0, 0.5, 1.0)):
            run = Run(qwen2, TOOLS)
            tool_agent(run, timestamp, turns=3)
            runs.append(run.trajectory(reward, f"{g}-{k}").to_art())
        groups.append(art.TrajectoryGroup(runs))
    metrics = step_continuity(groups)
    assert metrics["continuity_break_rate"] == 1.0 and metrics["continuity_breaks"] == 24
    assert metrics["continuity_breaks_other"] == 24 == metrics["continuity_edits_system"]
    trained = list(
        tokenize_trajectory_groups(
            qwen2, groups, allow_training_without_logprobs=False, scale_rewards=True
        )
    )
    assert metrics["art_sequences"] == len(trained) == 24  # 8 runs trained, 3 sequences each
    assert metrics["continuity_conversations"] == 8  # the same 8 runs (the middle one skipped)
    with pytest.warns(at.TokenContinuityWarning) as got:
        warn_continuity(2, metrics)
    message = str(got[0].message)
    assert "24 of 24 turn boundaries" in message
    assert "(the runs ART trains: 24 sequences for 8 conversations)" in message
    assert "Most common cause: other (24 of 24; template: 0, retokenized: 0, other: 24)" in message
    assert "24 of the other breaks are earlier messages the agent changed between calls " in (
        message
    )
    assert "(system: 24)" in message and "a guess" not in message


def test_a_tie_between_causes_names_both_and_both_fixes() -> None:
    metrics = {
        **step_continuity([]),
        "continuity_break_rate": 1.0,
        "continuity_boundaries": 2.0,
        "continuity_breaks": 2.0,
        "continuity_breaks_template": 1.0,
        "continuity_breaks_other": 1.0,
    }
    with pytest.warns(at.TokenContinuityWarning) as got:
        warn_continuity(0, metrics)
    message = str(got[0].message)
    assert "Most common causes, tied: template and other (1 each of 2;" in message
    assert _continuity.FIXES["template"] in message and _continuity.FIXES["other"] in message


def test_a_guessed_cause_says_so_and_the_trainers_tokenizer_decides_for_name_at_step(
    qwen2: Any, tmp_path: Path
) -> None:
    """ART's LocalBackend serves the model as ``name@step``: no tokenizer goes by that name,
    so the cause is a guess, and the step says so. The Trainer's model names its base model,
    whose tokenizer this machine holds: the texts decide."""
    folder = tmp_path / "qwen2.5"
    folder.mkdir()
    qwen2.backend_tokenizer.save(str(folder / "tokenizer.json"))
    run = Run(qwen2)
    history = [user("Greet me.")]
    sampled = [32713, 385, 1879, 151645]  # "Hel", "lo", " world", "<|im_end|>"
    history.append(run.turn(history, assistant("Hello world"), sampled=sampled, model="m@3"))
    history.append(user("Again."))
    run.turn(history, assistant("Hello world"), model="m@3")
    t = run.trajectory()
    ((cause, by),) = [(b.cause, b.decided_by) for b in run_continuity(t).breaks]
    assert (cause, by) == ("retokenized", "guess")
    metrics = step_continuity([t])
    assert metrics["continuity_breaks_guessed"] == 1
    with pytest.warns(at.TokenContinuityWarning, match="is a guess") as got:
        warn_continuity(0, metrics)
    assert "Trainer(tokenizer=...)" in str(got[0].message)

    class Model:
        name, base_model = "m", str(folder)

    policy = _continuity.PolicyTokenizer.for_trainer(None, lambda: Model())
    assert policy.served("m@3") and policy.served("m") and not policy.served("m@x")
    assert [(b.cause, b.decided_by) for b in run_continuity(t, policy).breaks] == [
        ("retokenized", "text")
    ]
    given = _continuity.PolicyTokenizer.for_trainer(str(folder), lambda: None)
    assert [b.decided_by for b in run_continuity(t, given).breaks] == ["text"]
    loaded = _continuity.PolicyTokenizer.for_trainer(qwen2, lambda: None)  # a transformers one
    assert [b.decided_by for b in run_continuity(t, loaded).breaks] == ["text"]
    assert t.to_art(given).metadata["continuity_breaks_guessed"] == 0
    assert t.to_art().metadata["continuity_breaks_guessed"] == 1
    with pytest.raises(at.ConfigurationError, match=r"tokenizer='no/such-model'.*not a folder"):
        _continuity.PolicyTokenizer.for_trainer("no/such-model", lambda: None)
    with pytest.raises(at.ConfigurationError, match="got int"):
        _continuity.PolicyTokenizer.for_trainer(3, lambda: None)


def test_a_check_that_fails_leaves_to_art_whole_and_says_so(
    qwen2: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never break the host: the check failing (a bug of arttrace's) costs the run its
    continuity metadata, logged, not its conversion."""
    run = Run(qwen2)
    history = [user("Hi.")]
    history += [run.turn(history, assistant("Hello.")), user("Bye.")]
    run.turn(history, assistant("Bye."))

    def broken(*args: Any) -> RunContinuity:
        raise RuntimeError("a bug in the check")

    monkeypatch.setattr(_continuity, "continuity", broken)
    result = run.trajectory().to_art()
    assert result.metadata == {"example_id": "r"} and len(result.messages_and_choices) == 4
    assert (
        "checking a run's token continuity" in caplog.text and "a bug in the check" in caplog.text
    )


# -- the Trainer ---------------------------------------------------------------------------------


class Backend:
    def __init__(self) -> None:
        self.shipped: list[list[art.TrajectoryGroup]] = []

    async def register(self, model: Any) -> None:
        pass

    async def train(self, model: Any, groups: Any, **kwargs: Any) -> art.TrainResult:
        self.shipped.append(list(groups))
        return art.TrainResult(step=len(self.shipped), metrics={"loss": 0.1})


async def test_the_trainer_reports_continuity_and_warns_once_per_step(
    tmp_path: Path, server: Any, qwen3: Any
) -> None:
    """A two-turn agent on a Qwen3 server: each run's second prompt renders the first answer
    without the ``<think>`` block it was sampled with. (Needs the continuity lines in
    ``training/_step.py``'s ``finish``.)"""
    llm = ScriptedLLM(lambda request: Reply("four"), tokenizer=HFChatTokenizer(qwen3))
    served: LLMServer = server(llm)
    client = openai.AsyncOpenAI(base_url=served.base_url, api_key="k", max_retries=0)
    seen: dict[str, int] = {}

    @at.trainable
    async def ask(messages: list[Any]) -> str:
        reply = await client.chat.completions.create(model="policy", messages=messages)
        return reply.choices[0].message.content or ""

    async def rollout(example: dict[str, str]) -> float:
        messages: list[Any] = [user(example["q"])]
        messages += [assistant(await ask(messages)), user("Are you sure?")]
        await ask(messages)
        seen[example["id"]] = seen.get(example["id"], 0) + 1
        return float(seen[example["id"]] % 2)  # each group's two runs differ

    model = art.TrainableModel(
        name="m", project="p", base_model="Qwen/Qwen3-0.6B", run_name="r",
        base_path=str(tmp_path / ".art"),
    )  # fmt: skip
    backend = Backend()
    trainer = at.Trainer(
        model,
        backend,
        rollout,
        [{"id": f"ex-{i}", "q": f"What is {i}+{i}?"} for i in range(2)],
        group_size=2,
        groups_per_step=2,
        output_dir=tmp_path / "out",
        progress=False,
        log_to_model=False,
    )
    at.instrument()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = await trainer.step()
    finally:
        at.uninstrument()
        await client.close()
    shipped = [t for g in backend.shipped[0] for t in g.trajectories]
    assert len(shipped) == 4 and all(t.metadata["continuity_breaks_template"] == 1 for t in shipped)
    assert result.metrics["continuity_boundaries"] == 4
    assert result.metrics["continuity_breaks_template"] == 4
    assert result.metrics["continuity_break_rate"] == 1.0
    assert result.metrics["art_sequences"] == 8
    (warning,) = [w for w in caught if w.category is at.TokenContinuityWarning]
    assert "step 0: 4 of 4 turn boundaries" in str(warning.message)
    assert "Most common cause: template" in str(warning.message)


class SplitHello(HFChatTokenizer):
    """A server whose model samples "Hello world" as "Hel" + "lo" + " world"."""

    def completion(self, messages: Any, tools: Any, reply: dict[str, Any]) -> Completion:
        if reply.get("content") == "Hello world":
            return Completion([32713, 385, 1879, 151645], 3, [])
        return super().completion(messages, tools, reply)


async def test_the_trainer_counts_edits_and_finds_its_models_tokenizer_for_name_at_step(
    tmp_path: Path, server: Any, qwen2: Any
) -> None:
    """Over HTTP, on a server rendering Qwen2.5's template: one example's agent puts the time
    in its system prompt, the other's model sampled a split token. The agent calls the model
    as ART's LocalBackend serves it (``m@0``); the Trainer's model names its base model, a
    folder holding the tokenizer: the retokenized breaks are told by their text, not guessed.
    The step's counts equal ART's own on the groups it shipped; the tie is named."""
    folder = tmp_path / "base"
    folder.mkdir()
    qwen2.backend_tokenizer.save(str(folder / "tokenizer.json"))

    def reply(request: dict[str, Any]) -> Reply:
        asked = request["messages"][1]["content"]
        return Reply("Hello world" if asked == "Greet me." else "Ten.")

    served: LLMServer = server(ScriptedLLM(reply, tokenizer=SplitHello(qwen2)))
    client = openai.AsyncOpenAI(base_url=served.base_url, api_key="k", max_retries=0)
    clock = iter(range(1000))
    runs: dict[str, int] = {}

    @at.trainable
    async def ask(messages: list[Any]) -> str:
        out = await client.chat.completions.create(model="m@0", messages=messages)
        return out.choices[0].message.content or ""

    async def rollout(example: dict[str, str]) -> float:
        def system() -> dict[str, Any]:
            stamp = f" It is {next(clock)} o'clock." if example["id"] == "timed" else ""
            return {"role": "system", "content": "You help." + stamp}

        history: list[Any] = [system(), user(example["q"])]
        history.append(assistant(await ask(history)))
        history += [user("Again.")]
        await ask([system(), *history[1:]])
        runs[example["id"]] = runs.get(example["id"], 0) + 1
        return float(runs[example["id"]] % 2)

    model = art.TrainableModel(
        name="m", project="p", base_model=str(folder), run_name="r",
        base_path=str(tmp_path / ".art"),
    )  # fmt: skip
    backend = Backend()
    trainer = at.Trainer(
        model,
        backend,
        rollout,
        [{"id": "timed", "q": "What is 5+5?"}, {"id": "greet", "q": "Greet me."}],
        group_size=2,
        groups_per_step=2,
        output_dir=tmp_path / "out",
        progress=False,
        log_to_model=False,
    )
    at.instrument()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = await trainer.step()
    finally:
        at.uninstrument()
        await client.close()
    metrics = result.metrics
    assert metrics["continuity_boundaries"] == 4 and metrics["continuity_break_rate"] == 1.0
    assert metrics["continuity_breaks_other"] == 2 == metrics["continuity_edits_system"]
    assert metrics["continuity_breaks_retokenized"] == 2
    assert metrics["continuity_breaks_guessed"] == 0  # m@0 is the base model: its tokenizer
    assert metrics["continuity_conversations"] == 4
    trained = list(
        tokenize_trajectory_groups(
            qwen2, backend.shipped[0], allow_training_without_logprobs=False, scale_rewards=True
        )
    )
    assert metrics["art_sequences"] == len(trained) == 8
    (warning,) = [w for w in caught if w.category is at.TokenContinuityWarning]
    message = str(warning.message)
    assert "Most common causes, tied: retokenized and other (2 each of 4" in message
    assert "(system: 2)" in message and "a guess" not in message
    with pytest.raises(at.ConfigurationError, match=r"Trainer\(tokenizer='no/such-model'\)"):
        at.Trainer(
            model, backend, rollout, [{"id": "x", "q": "?"}], output_dir=tmp_path / "other",
            tokenizer="no/such-model",
        )  # fmt: skip
