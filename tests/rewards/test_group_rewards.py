"""Group rewards (``Trainer(group_reward=...)``) and the built-in judge, ``rewards.ruler``:
each group judged as soon as its runs are in, ART trains on the judge's rewards, each run keeps
its own as ``independent_reward``, a resume never judges a group twice, a judge that fails
fails its group's runs under ``max_exceptions`` with the cause, RULER shows the judge every
history and tool call, and the judge's own calls never enter a run."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

import arttrace as at
from arttrace.rewards import JudgeError, ruler
from arttrace.testing import Reply, ScriptedLLM, ToolCall, serve
from arttrace.training._report import progress_line
from support.common import TOOLS
from support.trainer import Agent, RecordingBackend, SteppingBackend, dataset, journaled, make

GROUPS = 3
GROUP_SIZE = 4


@pytest.fixture(autouse=True)
def _instrumented(instrumented: None) -> None:
    pass


def by_rollout(group: at.Group[Any]) -> list[float]:
    """A judge that ranks a group's runs by their rollout number: rewards the runs' own
    rewards (``k % 2``) never give."""
    return [0.1 * (run.rollout + 1) for run in group.runs]


def group_rewards(out: Path, step: int = 0) -> list[dict[str, Any]]:
    path = out / "journal" / f"step-{step:05d}" / "group_rewards.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def valid(ids: list[str], number: int) -> str:
    """A judge's good answer: run ``i`` scores ``i / 10``."""
    scores = [{"run_id": i, "explanation": f"run {i}", "score": int(i) / 10} for i in ids]
    return json.dumps({"scores": scores})


class Judge(ScriptedLLM):
    """A scripted judge: ``answer(run ids, request number)`` is its reply's text."""

    def __init__(self) -> None:
        super().__init__(self.reply)
        self.answer: Callable[[list[str], int], str] = valid
        self.down: Callable[[str, int], int] = lambda prompt, n: 0
        self.served: Counter[str] = Counter()
        self.url = ""

    def respond(self, body: dict[str, Any]) -> tuple[int, dict[str, Any] | None, Any]:
        """The status ``down(prompt, n)`` gives, if any (``n``: that group's request number)."""
        with self._lock:
            prompt = str(body.get("messages", [{}, {}])[-1].get("content", ""))[:200]
            self.served[prompt] += 1
            status = self.down(prompt, self.served[prompt])
            if status:
                self.requests.append(body)
        if status:
            return status, {"error": {"message": "judge overloaded", "type": "error"}}, None
        return super().respond(body)

    def reply(self, request: dict[str, Any]) -> Reply:
        system = request["messages"][0]["content"]
        ids = re.search(r"each of these run ids: ([\d, ]+)\.", system)
        assert ids, system
        return Reply(self.answer(ids[1].split(", "), len(self.requests)))


@pytest.fixture(scope="module")
def judge_llm() -> Iterator[Judge]:
    llm = Judge()
    with serve(llm) as running:
        llm.url = running.base_url
        yield llm


@pytest.fixture
def judge(judge_llm: Judge) -> Judge:
    """The module's judge server, fresh for this test (no requests, valid answers)."""
    judge_llm.requests.clear()
    judge_llm.answer = valid
    judge_llm.down = lambda prompt, n: 0
    judge_llm.served.clear()
    return judge_llm


# -- the group reward function ---------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_art_trains_on_the_judges_rewards_and_each_run_keeps_its_own(tmp_path, kind):
    seen: list[at.Group[Any]] = []

    def sync_judge(group: at.Group[Any]) -> Any:
        seen.append(group)
        return np.array(by_rollout(group))  # any sequence of real numbers

    async def async_judge(group: at.Group[Any]) -> at.GroupRewards:
        seen.append(group)
        return at.GroupRewards(by_rollout(group), metrics={"judge_calls": 1})

    backend = RecordingBackend()
    trainer = make(
        tmp_path,
        Agent(),
        backend,
        train_dataset=dataset(GROUPS),
        group_reward=sync_judge if kind == "sync" else async_judge,
    )
    result = await trainer.step()

    assert sorted(g.example_id for g in seen) == ["ex-0", "ex-1", "ex-2"]
    for group in seen:
        assert group.example == {"id": group.example_id, "q": f"question {group.example_id[3:]}"}
        assert [run.rollout for run in group.runs] == [0, 1, 2, 3]
        assert [run.reward for run in group.runs] == [0.0, 1.0, 0.0, 1.0]  # their own
        assert {run.output for run in group.runs} == {f"answer to {group.example['q']}"}
        assert all(run.trajectory.example_id == group.example_id for run in group.runs)
    ((groups, _),) = backend.calls
    for group in groups:  # what ART receives: the judge's rewards, the own ones as metrics
        assert [t.reward for t in group.trajectories] == pytest.approx([0.1, 0.2, 0.3, 0.4])
        own = [t.metrics["independent_reward"] for t in group.trajectories]
        assert own == [0.0, 1.0, 0.0, 1.0]
    assert result.metrics["reward_mean"] == pytest.approx(0.25)
    assert result.metrics["independent_reward_mean"] == pytest.approx(0.5)
    assert result.metrics["groups_judged"] == GROUPS
    assert result.metrics["groups_judge_failed"] == 0
    assert result.metrics["group_reward_seconds"] >= 0
    assert result.metrics.get("judge_calls", GROUPS) == GROUPS  # summed over the groups
    lines = group_rewards(tmp_path / "out")
    assert sorted(line["example_id"] for line in lines) == ["ex-0", "ex-1", "ex-2"]
    assert all(line["rewards"] == pytest.approx([0.1, 0.2, 0.3, 0.4]) for line in lines)
    # the rollout line keeps the run's own reward: the judgment is its own record
    assert (
        sorted(line["trajectory"]["reward"] for line in journaled(tmp_path / "out", 0))
        == [0.0] * 6 + [1.0] * 6
    )
    # the run store (viewer, `arttrace runs`, exports) shows the rewards the runs trained on
    store = at.open_run(tmp_path / "out")
    rows = store.trajectories(order="id", limit=100)
    assert sorted(r.reward for r in rows) == pytest.approx(sorted([0.1, 0.2, 0.3, 0.4] * GROUPS))
    assert [g.rewards for g in store.groups(0)] == [pytest.approx([0.1, 0.2, 0.3, 0.4])] * GROUPS
    run = store.trajectory(rows[1].id)
    assert run.reward == rows[1].reward and run.metrics["independent_reward"] in (0.0, 1.0)


async def test_a_group_is_judged_while_the_other_groups_still_run(tmp_path):
    """The last example's runs wait until a group has been judged: judging only after the
    whole step would never finish."""
    agent = Agent()
    judged = asyncio.Event()

    async def rollout(example: dict[str, Any]) -> float:
        if example["id"] == "ex-2":
            await asyncio.wait_for(judged.wait(), timeout=10)
        return await agent.rollout(example)

    async def judge(group: at.Group[Any]) -> list[float]:
        judged.set()
        return by_rollout(group)

    trainer = make(tmp_path, agent, train_dataset=dataset(GROUPS), group_reward=judge)
    trainer.rollout = rollout
    result = await trainer.step()
    assert result.metrics["groups_judged"] == GROUPS and result.metrics["exceptions"] == 0


async def test_a_rollout_need_not_score_itself_with_a_judge(tmp_path):
    """With a group reward and no reward_fn, a rollout may return its answer: its own
    reward is then 0.0, as ART's default."""
    agent = Agent()

    async def answers(example: dict[str, Any]) -> str:
        return await agent._solve(example["q"])

    backend = RecordingBackend()
    trainer = make(tmp_path, agent, backend, train_dataset=dataset(GROUPS), group_reward=by_rollout)
    trainer.rollout = answers
    result = await trainer.step()
    assert result.metrics["exceptions"] == 0 and result.metrics["groups_kept"] == GROUPS
    for group in backend.calls[0][0]:
        assert [t.metrics["independent_reward"] for t in group.trajectories] == [0.0] * 4


async def test_runs_that_raised_stay_failed_and_the_others_are_judged(tmp_path):
    agent = Agent()
    judged: dict[str, list[int]] = {}

    async def rollout(example: dict[str, Any]) -> float:
        k = agent.runs[example["id"]]
        if example["id"] == "ex-1" and k == 2:
            agent.runs[example["id"]] += 1
            raise RuntimeError("the agent's tool broke")
        return await agent.rollout(example)

    def judge(group: at.Group[Any]) -> list[float]:
        judged[group.example_id] = [run.rollout for run in group.runs]
        return by_rollout(group)

    backend = RecordingBackend()
    trainer = make(tmp_path, agent, backend, train_dataset=dataset(GROUPS), group_reward=judge)
    trainer.rollout = rollout
    result = await trainer.step()
    assert judged["ex-1"] == [0, 1, 3] and judged["ex-0"] == [0, 1, 2, 3]
    assert result.metrics["exceptions"] == 1
    (ex1,) = [g for g in backend.calls[0][0] if g.metadata["example_id"] == "ex-1"]
    assert [t.reward for t in ex1.trajectories] == pytest.approx([0.1, 0.2, 0.4])
    assert [e.message for e in ex1.exceptions] == ["the agent's tool broke"]


# -- failures: never silent --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (lambda g: [0.5] * 3, "returned 3 rewards for the group's 4 runs"),
        (lambda g: [0.5, 0.5, float("nan"), 0.5], "the reward of run 2 is not a reward"),
        (lambda g: {"r": 1}, "returned dict"),
        (lambda g: [0.5, True, 0.5, 0.5], "use 1.0 and 0.0"),
    ],
)
async def test_a_wrong_answer_fails_the_group_naming_example_and_fix(tmp_path, answer, says):
    def judge(group: at.Group[Any]) -> Any:
        return answer(group) if group.example_id == "ex-1" else by_rollout(group)

    trainer = make(
        tmp_path, Agent(), train_dataset=dataset(GROUPS), group_reward=judge, max_exceptions=0
    )
    with pytest.raises(at.TrainingError) as caught:
        await trainer.step()
    message = str(caught.value)
    assert "step 0: 4 of 12 rollouts raised" in message
    assert "ConfigurationError: group_reward for example 'ex-1' (step 0)" in message
    assert says in message and "one finite real number per run of group.runs" in message
    assert message.endswith("step-00000/group_rewards.jsonl)")  # where the cause is kept


async def test_a_judge_that_raises_counts_under_max_exceptions_and_is_logged(tmp_path, caplog):
    def judge(group: at.Group[Any]) -> list[float]:
        if group.example_id == "ex-1":
            raise ConnectionError("judge server down")
        return by_rollout(group)

    backend = RecordingBackend()
    trainer = make(
        tmp_path,
        Agent(),
        backend,
        train_dataset=dataset(GROUPS),
        group_reward=judge,
        max_exceptions=GROUP_SIZE,
    )
    with caplog.at_level(logging.WARNING, logger="arttrace"):
        result = await trainer.step()
    assert result.metrics["exceptions"] == GROUP_SIZE
    assert result.metrics["groups_judged"] == 2 and result.metrics["groups_judge_failed"] == 1
    assert sorted(g.metadata["example_id"] for g in backend.calls[0][0]) == ["ex-0", "ex-2"]
    (logged,) = [r.getMessage() for r in caplog.records if "group_reward" in r.getMessage()]
    assert "group_reward for example 'ex-1' (step 0) raised ConnectionError" in logged
    assert "judge server down" in logged and "count as raised under max_exceptions" in logged
    (failed,) = [line for line in group_rewards(tmp_path / "out") if "error" in line]
    assert failed["example_id"] == "ex-1" and failed["error"]["type"] == "ConnectionError"


def test_group_reward_must_be_a_function(tmp_path):
    with pytest.raises(at.ConfigurationError, match="group_reward must be a function"):
        make(tmp_path, Agent(), train_dataset=dataset(1), group_reward=[0.1, 0.2])


# -- resume ------------------------------------------------------------------------------------


async def test_a_resumed_step_never_judges_a_journaled_group_again(tmp_path):
    """Killed (Ctrl-C) with one group judged and two judgments in flight: the resumed step
    judges only those two, and ships the first group with its journaled rewards."""
    calls: list[str] = []
    started = asyncio.Event()

    async def first_judge(group: at.Group[Any]) -> list[float]:
        calls.append(group.example_id)
        if len(calls) == GROUPS:
            started.set()
        if len(calls) > 1:
            await asyncio.Event().wait()  # in flight when the process dies
        return [0.9 - 0.1 * run.rollout for run in group.runs]

    agent = Agent()
    trainer = make(tmp_path, agent, train_dataset=dataset(GROUPS), group_reward=first_judge)
    step = asyncio.ensure_future(trainer.step())
    await asyncio.wait_for(started.wait(), timeout=10)
    step.cancel()
    with pytest.raises(asyncio.CancelledError):
        await step
    (journaled_group,) = group_rewards(tmp_path / "out")
    assert journaled_group["example_id"] == calls[0]

    again: list[str] = []

    def resumed_judge(group: at.Group[Any]) -> list[float]:
        again.append(group.example_id)
        return by_rollout(group)

    backend = SteppingBackend()
    resumed = make(
        tmp_path,
        agent,
        backend,
        train_dataset=dataset(GROUPS),
        group_reward=resumed_judge,
        resume=True,
    )
    result = await resumed.step()
    assert sorted(again) == sorted(calls[1:])  # each group judged once in all
    assert sum(agent.finished.values()) == GROUPS * GROUP_SIZE  # and each run ran once
    for group in backend.calls[0][0]:
        rewards = [t.reward for t in group.trajectories]
        first = group.metadata["example_id"] == calls[0]
        assert rewards == pytest.approx([0.9, 0.8, 0.7, 0.6] if first else [0.1, 0.2, 0.3, 0.4])
    assert result.metrics["groups_judged"] == GROUPS


# -- pipelined training ------------------------------------------------------------------------


async def test_pipelined_steps_judge_every_group_once(tmp_path):
    calls: list[tuple[int, str]] = []

    async def judge(group: at.Group[Any]) -> list[float]:
        calls.append((group.step, group.example_id))
        await asyncio.sleep(0.01)
        return by_rollout(group)

    backend = SteppingBackend()
    trainer = make(
        tmp_path,
        Agent(),
        backend,
        train_dataset=dataset(2 * GROUPS),
        group_reward=judge,
        max_steps_off_policy=1,
    )
    results = await trainer.train(num_steps=2)
    assert len(calls) == len(set(calls)) == 2 * GROUPS  # every group of both steps, once
    assert sorted(step for step, _ in calls) == [0] * GROUPS + [1] * GROUPS
    assert [r.metrics["groups_judged"] for r in results] == [GROUPS, GROUPS]
    for groups, _ in backend.calls:
        for group in groups:
            assert [t.reward for t in group.trajectories] == pytest.approx([0.1, 0.2, 0.3, 0.4])


# -- RULER -------------------------------------------------------------------------------------


class ToolAgent:
    """A main conversation with a tool call and its result, plus a sub-agent's conversation
    (a summariser): an ``additional_histories`` entry in ART's form."""

    def __init__(self, base_url: str) -> None:
        self.client = openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0)

    async def rollout(self, example: dict[str, Any]) -> float:
        k = int(str(at.current_trajectory().metadata["rollout"]))
        await self._solve(example["q"], k)
        return float(k % 2)

    @at.trainable
    async def _solve(self, question: str, k: int) -> str:
        messages: list[Any] = [
            {"role": "system", "content": "You add numbers."},
            {"role": "user", "content": question},
        ]
        first = await self.client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS
        )
        call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": f"tool says {5 + k}"},
        ]
        second = await self.client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS
        )
        summary = await self.client.chat.completions.create(
            model="policy",
            messages=[{"role": "user", "content": f"Summarise run {k} for the notes"}],
        )
        return (second.choices[0].message.content or "") + (
            summary.choices[0].message.content or ""
        )


def policy_reply(request: dict[str, Any]) -> Reply:
    last = request["messages"][-1]
    if last["role"] == "user" and last["content"].startswith("Summarise"):
        return Reply("sub-agent notes for " + last["content"][-20:])
    if last["role"] == "user":
        return Reply("Let me add.", tool_calls=[ToolCall("add", {"a": 2, "b": 3})])
    return Reply(f"The sum is {last['content']}.")


async def test_ruler_shows_the_judge_every_history_and_tool_call_and_is_not_captured(
    tmp_path, judge, server
):
    judge_url = judge.url
    policy = ToolAgent(server(ScriptedLLM(policy_reply)).base_url)
    backend = RecordingBackend()
    trainer = make(
        tmp_path,
        Agent(),
        backend,
        train_dataset=dataset(1),
        group_reward=ruler(model="judge", base_url=judge_url, api_key="k"),
    )
    trainer.rollout = policy.rollout
    result = await trainer.step()

    ((request,),) = [judge.requests]
    assert request["model"] == "judge"
    assert request["response_format"]["type"] == "json_schema"
    prompt = request["messages"][1]["content"]
    assert prompt.count('<run id="') == GROUP_SIZE
    assert "You add numbers." in prompt and prompt.count("You add numbers.") == 1  # shared once
    assert '"name":"add"' in prompt and '"arguments":"{\\"a\\": 2, \\"b\\": 3}"' in prompt
    for k in range(GROUP_SIZE):
        assert f'"content":"tool says {5 + k}"' in prompt  # each run's tool result
        assert f"Summarise run {k} for the notes" in prompt  # each run's sub-agent
    assert prompt.count('<conversation kind="other" n="1">') == GROUP_SIZE
    assert '<tools>\n{"type":"function"' in prompt and prompt.count("<tools>") == 1

    ((groups, _),) = backend.calls
    (group,) = groups
    assert all(len(t.additional_histories) == 1 for t in group.trajectories)
    assert [t.reward for t in group.trajectories] == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert [t.metrics["independent_reward"] for t in group.trajectories] == [0, 1, 0, 1]
    assert result.metrics["judge_calls"] == 1 and result.metrics["judge_retries"] == 0
    usage_prompt = len(judge.tokenizer.prompt(request["messages"], None))
    assert result.metrics["judge_prompt_tokens"] == usage_prompt
    assert result.metrics["judge_completion_tokens"] > 0 and result.metrics["judge_seconds"] > 0
    (line,) = group_rewards(tmp_path / "out")
    assert line["explanations"] == ["run 1", "run 2", "run 3", "run 4"]
    # with instrument() on, each run holds exactly its own three calls: none of the judge's
    for record in journaled(tmp_path / "out", 0):
        models = [c["model"] for c in record["trajectory"]["calls"]]
        assert models == ["policy"] * 3, models


async def test_ruler_called_inside_a_run_leaves_the_run_alone(judge):
    """Called by hand inside an open trajectory (with instrument() on), the judge's call is
    still not recorded: capture is off for it."""
    client = openai.AsyncOpenAI(base_url=judge.url, api_key="k", max_retries=0)
    score = ruler(model="judge", client=client)
    inner = at.trajectory("outer", metadata={})
    with at.trajectory("a-run") as t:
        inner.reward = 0.0
        answer = await score(at.Group("ex", None, 0, (at.GroupRun(0, inner, 0.0),) * 2))
    assert answer.rewards == [0.1, 0.2] and len(judge.requests) == 1
    assert t.calls == []
    await client.close()


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        ("not json at all", "it is not JSON"),
        (json.dumps({"scores": [{"run_id": "1", "score": 0.5, "explanation": ""}]}), "not scored"),
        (
            json.dumps(
                {"scores": [{"run_id": i, "score": 1.5, "explanation": ""} for i in "1234"]}
            ),
            "score 1.5 is not a number in [0, 1]",
        ),
    ],
)
async def test_a_malformed_answer_is_sent_back_then_fails_with_the_cause(
    tmp_path, judge, bad, problem
):
    # one bad answer, then a good one: sent back once, the step ships
    judge.answer = lambda ids, n: bad if n == 1 else valid(ids, n)
    trainer = make(
        tmp_path / "a",
        Agent(),
        train_dataset=dataset(1),
        group_reward=ruler(model="judge", base_url=judge.url, api_key="k", max_attempts=2),
    )
    result = await trainer.step()
    assert result.metrics["judge_calls"] == 2 and result.metrics["judge_retries"] == 1
    assert result.metrics["groups_kept"] == 1
    retry = judge.requests[1]["messages"]
    assert retry[2] == {"role": "assistant", "content": bad}
    assert retry[3]["content"].startswith("That answer cannot be used: ")
    assert problem in retry[3]["content"]

    # always bad: the group fails after max_attempts calls, with the cause
    judge.requests.clear()
    judge.answer = lambda ids, n: bad
    trainer = make(
        tmp_path / "b",
        Agent(),
        train_dataset=dataset(1),
        group_reward=ruler(model="judge", base_url=judge.url, api_key="k", max_attempts=2),
        max_exceptions=0,
    )
    with pytest.raises(at.TrainingError) as caught:
        await trainer.step()
    message = str(caught.value)
    assert len(judge.requests) == 2
    assert "JudgeError: group_reward for example 'ex-0' (step 0) raised JudgeError" in message
    assert "the judge 'judge' gave no usable scores in 2 calls" in message and problem in message


async def test_a_judge_server_error_is_retried_within_max_attempts_and_every_request_counted(
    tmp_path, judge
):
    """One retry budget: the OpenAI client does not retry underneath ``max_attempts``, and
    every request the judge's server answered (500s too) is in ``judge_calls``."""
    judge.down = lambda prompt, n: 500 if n == 1 else 0  # each group's first request
    trainer = make(
        tmp_path / "a",
        Agent(),
        train_dataset=dataset(GROUPS),
        group_reward=ruler(model="judge", base_url=judge.url, api_key="k", max_attempts=3),
    )
    result = await trainer.step()
    assert len(judge.requests) == 2 * GROUPS  # served
    assert result.metrics["judge_calls"] == 2 * GROUPS and result.metrics["judge_retries"] == GROUPS
    assert result.metrics["groups_judged"] == GROUPS and result.metrics["groups_kept"] == GROUPS

    # one group's judge always answers 500: max_attempts requests, all counted; the group
    # fails with the cause under max_exceptions, and counts as dropped
    judge.requests.clear()
    judge.served.clear()
    judge.down = lambda prompt, n: 500 if "question 1" in prompt else 0
    trainer = make(
        tmp_path / "b",
        Agent(),
        train_dataset=dataset(GROUPS),
        group_reward=ruler(model="judge", base_url=judge.url, api_key="k", max_attempts=2),
        max_exceptions=GROUP_SIZE,
    )
    result = await trainer.step()
    assert len(judge.requests) == (GROUPS - 1) + 2
    assert result.metrics["judge_calls"] == len(judge.requests)
    assert result.metrics["groups_judge_failed"] == 1 and result.metrics["exceptions"] == GROUP_SIZE
    assert result.metrics["groups_dropped"] == 1 and result.metrics["groups_kept"] == GROUPS - 1
    line = progress_line(result.metrics, "train")  # named for what it is, not "flat"
    assert "2 of 3 groups shipped (1 whose group reward failed)" in line, line
    (failed,) = [line for line in group_rewards(tmp_path / "b" / "out") if "error" in line]
    assert failed["example_id"] == "ex-1" and failed["error"]["type"] == "JudgeError"
    message = failed["error"]["message"]
    assert "the judge 'judge' gave no usable scores in 2 calls" in message
    assert "its server answered HTTP 500 (judge overloaded)" in message

    # refused (a wrong key or model): asked once, counted, and the cause names what to check
    judge.requests.clear()
    judge.down = lambda prompt, n: 401
    inner = at.trajectory("outer", metadata={})
    inner.reward = 0.0
    with pytest.raises(JudgeError) as refused:
        await ruler(model="judge", base_url=judge.url, api_key="k")(
            at.Group("ex", None, 0, (at.GroupRun(0, inner, 0.0),) * 2)
        )
    assert len(judge.requests) == 1 and refused.value.metrics["judge_calls"] == 1
    assert "failed: its server answered HTTP 401" in str(refused.value)
    assert "Check the judge's model name, base_url, api_key" in str(refused.value)


def test_ruler_refuses_what_it_cannot_use():
    with pytest.raises(at.ConfigurationError, match="needs the judge's model name"):
        ruler(model="")
    with pytest.raises(at.ConfigurationError, match="a client, or base_url"):
        ruler(model="j", client=openai.AsyncOpenAI(api_key="k"), base_url="http://x/v1")
    with pytest.raises(at.ConfigurationError, match="max_attempts must be an int >= 1"):
        ruler(model="j", max_attempts=0)
    assert issubclass(JudgeError, at.ArttraceError)
