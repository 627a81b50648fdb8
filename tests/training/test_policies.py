"""Several policies in one Trainer: each policy's groups hold exactly its own turns as
trainable Choices, ship to its own model, with its own reward; frozen policies, resume
exactly once per policy, pipelining, a policy with nothing to train, clear errors."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import art
import httpx
import openai
import pytest
from openai.types.chat.chat_completion import Choice

import arttrace as at
from arttrace._errors import ConfigurationError, UsageError
from arttrace.testing import Reply, ScriptedLLM
from support.policy_runs import Killed, ModelsBackend, model
from support.trainer import dataset, journaled


@pytest.fixture(autouse=True)
def _instrumented(instrumented: None) -> None:
    pass


class PlannerExecutor:
    """A planner on ``planner-001`` that plans, an executor on ``executor-001`` that answers
    from the plan; both calls inside one ``@trainable`` agent, as a two-model system is."""

    def __init__(self, rewards: Any = None) -> None:
        self.llm = ScriptedLLM(lambda r: Reply(f"{r['model']} says {len(r['messages'])}"))
        self.client = openai.AsyncOpenAI(
            base_url="http://scripted/v1",
            api_key="k",
            max_retries=0,
            http_client=httpx.AsyncClient(transport=self.llm.transport()),
        )
        self.runs = 0
        self.rewards = rewards or (lambda k: float(k % 2))
        self.plan = True

    @at.trainable
    async def agent(self, question: str) -> str:
        messages: list[Any] = [{"role": "user", "content": question}]
        if self.plan:
            plan = await self.client.chat.completions.create(model="planner-001", messages=messages)
            messages.append({"role": "assistant", "content": plan.choices[0].message.content})
            messages.append({"role": "user", "content": "now answer"})
        answer = await self.client.chat.completions.create(model="executor-001", messages=messages)
        return answer.choices[0].message.content or ""

    async def rollout(self, example: dict[str, Any]) -> Any:
        k, self.runs = self.runs, self.runs + 1
        await self.agent(example["q"])
        return self.rewards(k)


def two(tmp_path: Path, agent: PlannerExecutor, backend: Any, **kw: Any) -> at.Trainer[Any]:
    models = kw.pop("models", None)
    models = (
        []
        if models == ()
        else models
        or [
            at.Policy(model("planner-001", tmp_path), name="planner"),
            at.Policy(model("executor-001", tmp_path), name="executor"),
        ]
    )
    defaults: dict[str, Any] = {
        "group_size": 2,
        "groups_per_step": 2,
        "output_dir": tmp_path / "out",
        "progress": False,
        "log_to_model": False,
    }
    return at.Trainer(models, backend, agent.rollout, dataset(4), **{**defaults, **kw})


def turns(trajectory: art.Trajectory) -> tuple[list[str], list[str]]:
    """The texts of its trainable Choices and of its assistant context messages."""
    choices, context = [], []
    for item in trajectory.messages_and_choices:
        if isinstance(item, Choice):
            choices.append(item.message.content or "")
        elif item["role"] == "assistant":
            context.append(str(item.get("content")))
    return choices, context


async def test_each_policy_ships_exactly_its_own_turns_to_its_own_model(tmp_path):
    agent, backend = PlannerExecutor(), ModelsBackend()
    trainer = two(tmp_path, agent, backend)
    result = await trainer.step()

    assert [name for name, _ in backend.trained] == ["planner-001", "executor-001"]
    assert set(result.policy_groups) == {"planner", "executor"}
    for g in backend.groups("planner-001"):
        for t in g.trajectories:
            choices, context = turns(t)
            assert choices == ["planner-001 says 1"]  # its own turn, trainable
            assert context == ["executor-001 says 3"]  # the executor's answer: context
            [choice] = [c for c in t.messages_and_choices if isinstance(c, Choice)]
            assert choice.logprobs is not None and choice.logprobs.content  # the server's ids
    for g in backend.groups("executor-001"):
        for t in g.trajectories:
            choices, context = turns(t)
            assert choices == ["executor-001 says 3"]
            assert context == ["planner-001 says 1"]  # the planner's turn is context
    # the journal records each turn's policy, as the Trainer resolved it
    lines = (tmp_path / "out/journal/step-00000/rollouts.jsonl").read_text().splitlines()
    calls = [c for line in lines for c in json.loads(line)["trajectory"]["calls"]]
    assert {(c["model"], c["policy"]) for c in calls} == {
        ("planner-001", "planner"),
        ("executor-001", "executor"),
    }
    m = result.metrics
    assert m["planner/groups_kept"] == m["executor/groups_kept"] == 2
    assert m["groups_kept"] == 4 and m["groups_total"] == 4
    assert m["planner/train/loss"] == len("planner-001")
    assert m["executor/train/loss"] == len("executor-001")
    settings = json.loads((tmp_path / "out/state.json").read_text())["settings"]
    assert settings["policies"] == [
        {"name": "planner", "model": "planner-001", "frozen": False},
        {"name": "executor", "model": "executor-001", "frozen": False},
    ]
    shipped = json.loads((tmp_path / "out/journal/step-00000/shipped.json").read_text())
    assert sorted((d["policy"], d["why_not"]) for d in shipped["decisions"]) == [
        ("executor", None),
        ("executor", None),
        ("planner", None),
        ("planner", None),
    ]


async def test_per_policy_rewards_and_each_policys_independent_reward(tmp_path):
    rewards = lambda k: {"planner": float(k % 2), "executor": float((k // 2) % 2)}  # noqa: E731
    agent, backend = PlannerExecutor(rewards), ModelsBackend()

    def judge(group: at.Group[Any]) -> list[Any]:
        return [
            {"planner": 1.0 - run.trajectory.policy_rewards["planner"], "executor": 0.5 * i}
            for i, run in enumerate(group.runs)
        ]

    trainer = two(tmp_path, agent, backend, group_size=4, groups_per_step=1)
    result = await trainer.step()
    [planner] = backend.groups("planner-001")
    [executor] = backend.groups("executor-001")
    assert [t.reward for t in planner.trajectories] == [0.0, 1.0, 0.0, 1.0]
    assert [t.reward for t in executor.trajectories] == [0.0, 0.0, 1.0, 1.0]
    assert result.metrics["planner/reward_mean"] == 0.5
    assert result.metrics["reward_mean"] == 0.5  # each run's reward: the mean of its policies'

    judged = two(
        tmp_path,
        PlannerExecutor(rewards),
        backend := ModelsBackend(),
        group_size=4,
        groups_per_step=1,
        group_reward=judge,
        output_dir=tmp_path / "judged",
    )
    await judged.step()
    [planner] = backend.groups("planner-001")
    [executor] = backend.groups("executor-001")
    assert [t.reward for t in planner.trajectories] == [1.0, 0.0, 1.0, 0.0]
    assert [t.metrics["independent_reward"] for t in planner.trajectories] == [0, 1, 0, 1]
    assert [t.reward for t in executor.trajectories] == [0.0, 0.5, 1.0, 1.5]
    assert [t.metrics["independent_reward"] for t in executor.trajectories] == [0, 0, 1, 1]


async def test_a_frozen_policy_is_context_and_never_trains(tmp_path):
    agent, backend = PlannerExecutor(), ModelsBackend()
    policies = [
        at.Policy(model("planner-001", tmp_path), name="planner", frozen=True),
        at.Policy(model("executor-001", tmp_path), name="executor"),
    ]
    trainer = two(tmp_path, agent, backend, models=policies)
    result = await trainer.step()
    assert [name for name, _ in backend.trained] == ["executor-001"]
    assert "planner/groups_kept" not in result.metrics
    for t in backend.groups("executor-001")[0].trajectories:
        assert turns(t) == (["executor-001 says 3"], ["planner-001 says 1"])


async def test_killed_between_two_policies_training_resumes_exactly_once_each(tmp_path):
    agent, backend = PlannerExecutor(), ModelsBackend(killed_on="executor-001")
    with pytest.raises(Killed):
        await two(tmp_path, agent, backend).step()
    assert [name for name, _ in backend.trained] == ["planner-001"]
    step_dir = tmp_path / "out/journal/step-00000"
    assert (step_dir / "trained-planner.json").exists()
    assert not (step_dir / "shipped.json").exists()

    resumed = two(tmp_path, agent, backend, resume=True)
    result = await resumed.step()
    assert result.step == 0
    assert [name for name, _ in backend.trained] == ["planner-001", "executor-001"]
    assert agent.runs == 4  # no rollout ran twice
    assert result.metrics["planner/train/loss"] == len("planner-001")  # read back
    assert result.metrics["executor/train/loss"] == len("executor-001")
    await resumed.step()
    assert [name for name, _ in backend.trained][2:] == ["planner-001", "executor-001"]


async def test_killed_inside_the_second_policys_call_asks_its_backend(tmp_path):
    """Stopped after the executor's backend trained but before it was recorded: the
    resumed step asks that policy's backend and trains neither policy again."""
    agent, backend = PlannerExecutor(), ModelsBackend()
    trainer = two(tmp_path, agent, backend)
    real_mark = trainer._journal.mark_trained

    def dies_after_training(step: int, policy: str, metrics: dict[str, float]) -> None:
        if policy == "executor":
            raise Killed
        real_mark(step, policy, metrics)

    trainer._journal.mark_trained = dies_after_training  # type: ignore[method-assign]
    with pytest.raises(Killed):
        await trainer.step()
    assert len(backend.trained) == 2
    result = await two(tmp_path, agent, backend, resume=True).step()
    assert len(backend.trained) == 2  # neither trained twice
    assert result.step == 0


async def test_two_policies_pipelined(tmp_path):
    agent, backend = PlannerExecutor(), ModelsBackend()
    trainer = two(tmp_path, agent, backend, max_steps_off_policy=1)
    results = await trainer.train(num_steps=3)
    assert [name for name, _ in backend.trained] == ["planner-001", "executor-001"] * 3
    assert [r.metrics["off_policy_steps_max"] for r in results][1:] == [1, 1]


async def test_a_policy_with_no_turn_in_a_step_is_said_once_and_not_shipped(tmp_path):
    agent, backend = PlannerExecutor(), ModelsBackend()
    agent.plan = False  # the planner never acts
    trainer = two(tmp_path, agent, backend)
    with pytest.warns(at.NothingToTrainWarning) as caught:
        result = await trainer.step()
    said = [str(w.message) for w in caught if issubclass(w.category, at.NothingToTrainWarning)]
    assert len(said) == 1
    assert "policy 'planner'" in said[0] and "made no policy turn of 'planner'" in said[0]
    assert [name for name, _ in backend.trained] == ["executor-001"]
    assert result.metrics["planner/groups_without_trainable_tokens"] == 2
    assert result.metrics["planner/groups_kept"] == 0


async def test_turns_no_policy_claims_warn_once_and_stay_context(tmp_path):
    agent, backend = PlannerExecutor(), ModelsBackend()
    policies = [at.Policy(model("executor-001", tmp_path), name="executor")]
    trainer = two(tmp_path, agent, backend, models=policies)
    with pytest.warns(UserWarning, match="'planner-001'.*belong to none") as caught:
        await trainer.step()
    assert sum("belong to none" in str(w.message) for w in caught) == 1
    for t in backend.groups("executor-001")[0].trajectories:
        assert turns(t) == (["executor-001 says 3"], ["planner-001 says 1"])


async def test_validation_and_the_plot_show_each_policy(tmp_path):
    rewards = lambda k: {"planner": 1.0, "executor": 0.0}  # noqa: E731
    agent, backend = PlannerExecutor(rewards), ModelsBackend()
    trainer = two(tmp_path, agent, backend, val_dataset=dataset(2))
    metrics = await trainer.validate()
    assert metrics["planner/reward_mean"] == 1.0
    assert metrics["executor/reward_mean"] == 0.0
    assert metrics["reward_mean"] == 0.5
    with pytest.raises(UsageError, match=r"trainer\.policies"):
        trainer.model  # noqa: B018
    assert set(trainer.policies) == {"planner", "executor"}


@pytest.mark.parametrize(
    ("policies", "error"),
    [
        (lambda p: [at.Policy(p("a")), at.Policy(p("b"), name="a")], "two policies are named 'a'"),
        (lambda p: [at.Policy(p("a"), frozen=True)], "every policy is frozen"),
        (lambda p: [], "no model"),
    ],
)
def test_policies_that_cannot_train_are_refused(tmp_path, policies, error):
    with pytest.raises(ConfigurationError, match=error):
        two(
            tmp_path,
            PlannerExecutor(),
            ModelsBackend(),
            models=policies(lambda n: model(n, tmp_path)) or (),
        )


def test_a_curriculum_is_refused_with_several_policies(tmp_path):
    with pytest.raises(ConfigurationError, match="curriculum"):
        two(tmp_path, PlannerExecutor(), ModelsBackend(), curriculum=at.Curriculum())


async def test_policies_on_two_backends_train_concurrently(tmp_path):
    class Slow(ModelsBackend):
        def __init__(self, events: list[str]) -> None:
            super().__init__()
            self.events = events

        async def train(self, model: Any, groups: Any, **kwargs: Any) -> art.TrainResult:
            self.events.append(f"start {model.name}")
            await asyncio.sleep(0.05)
            self.events.append(f"end {model.name}")
            return await super().train(model, groups, **kwargs)

    events: list[str] = []
    planner_backend, executor_backend = Slow(events), Slow(events)
    policies = [
        at.Policy(model("planner-001", tmp_path), name="planner", backend=planner_backend),
        at.Policy(model("executor-001", tmp_path), name="executor", backend=executor_backend),
    ]
    await two(tmp_path, PlannerExecutor(), ModelsBackend(), models=policies).step()
    assert events[:2] == ["start planner-001", "start executor-001"]
    assert [n for n, _ in planner_backend.trained] == ["planner-001"]
    assert [n for n, _ in executor_backend.trained] == ["executor-001"]


async def test_dry_run_backend_writes_what_each_policy_would_train_on(tmp_path):
    backend = at.DryRunBackend(tmp_path / "dry")
    trainer = two(tmp_path, PlannerExecutor(), backend)
    for policy in trainer.policies.values():
        await policy.model.register(backend)
    await trainer.step()
    for name, own, other in (
        ("planner-001", "planner-001 says 1", "executor-001 says 3"),
        ("executor-001", "executor-001 says 3", "planner-001 says 1"),
    ):
        lines = (tmp_path / "dry" / name / "step-00000" / "groups.jsonl").read_text().splitlines()
        groups = [art.TrajectoryGroup.model_validate_json(line) for line in lines]
        assert len(groups) == 2
        report = json.loads((tmp_path / "dry" / name / "step-00000" / "report.json").read_text())
        assert report["trainable_tokens"] > 0
        text = lines[0]
        assert own in text and other in text  # its turn and the other's, as context


async def test_a_run_through_train_reports_and_plots_each_policy(tmp_path, capsys):
    rewards = lambda k: {"planner": float(k % 2), "executor": 1.0 - k % 2}  # noqa: E731
    trainer = two(
        tmp_path, PlannerExecutor(rewards), ModelsBackend(), val_dataset=dataset(2), progress=True
    )
    await trainer.train(num_steps=1)
    err = capsys.readouterr().err
    assert "planner: reward 0.500, 2 groups, loss 11" in err
    assert "executor: reward 0.500, 2 groups, loss 12" in err
    assert "val step 1: reward 0.500 over 2 runs; planner " in err
    validations = [
        json.loads(line) for line in (tmp_path / "out/validation.jsonl").read_text().splitlines()
    ]
    per_policy = [
        f"{p}/reward_{s}" for p in ("executor", "planner") for s in ("max", "mean", "min", "std")
    ]
    assert len(validations) == 2
    assert all(sorted(k for k in v if "/" in k) == per_policy for v in validations)
    assert (tmp_path / "out/reward_plot.png").stat().st_size > 10_000


@pytest.mark.parametrize("name", ["a/b", "train"])
def test_a_policy_name_that_cannot_prefix_metrics_is_refused(tmp_path, name):
    policies = [at.Policy(model("a", tmp_path), name=name), at.Policy(model("b", tmp_path))]
    with pytest.raises(ConfigurationError, match="cannot name a policy's metrics"):
        two(tmp_path, PlannerExecutor(), ModelsBackend(), models=policies)


async def test_each_policy_counts_its_own_trainings_for_the_off_policy_rule(tmp_path):
    agent, backend = PlannerExecutor(), ModelsBackend()
    agent.plan = False  # step 0: the planner does not act, so it does not train
    trainer = two(tmp_path, agent, backend)
    with pytest.warns(at.NothingToTrainWarning, match="policy 'planner'"):
        await trainer.step()
    agent.plan = True
    result = await trainer.step()
    metadata = journaled(tmp_path / "out", 1)[0]["trajectory"]["metadata"]
    assert metadata["policy_step"] == 1  # the Trainer's steps
    assert metadata["policy_step/planner"] == 0  # never trained when the run started
    assert metadata["policy_step/executor"] == 1
    assert result.metrics["planner/off_policy_steps_max"] == 0
    assert result.metrics["executor/off_policy_steps_max"] == 0
    state = json.loads((tmp_path / "out/state.json").read_text())
    assert state["policy_steps"] == {"planner": 1, "executor": 2}
    resumed = two(tmp_path, agent, backend, resume=True)
    assert resumed._policy_steps == {"planner": 1, "executor": 2}
