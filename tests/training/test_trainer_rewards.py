"""The reward of a Trainer run: its order of sources, and which values are rewards."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import arttrace as at
from arttrace._errors import ConfigurationError
from arttrace.capture._trajectory import check_reward
from support.trainer import Agent, RecordingBackend, dataset, journaled, make


@pytest.fixture(autouse=True)
def _instrumented(instrumented: None) -> None:
    pass


def saved_errors(out: Path, step: int = 0) -> list[str]:
    lines = journaled(out, step)
    return [line["trajectory"]["exception"]["message"] for line in lines]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (np.float32(0.5), 0.5),
        (np.float64(-1.25), -1.25),
        (np.int64(3), 3.0),
        (Decimal("0.25"), 0.25),
        (Fraction(1, 4), 0.25),
        (np.array(0.75), 0.75),
        (7, 7.0),
    ],
)
def test_any_real_number_is_a_reward(value, expected):
    assert check_reward(value) == expected and type(check_reward(value)) is float
    t = at.trajectory("ex")
    t.reward = value
    assert t.reward == expected


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (True, "got bool True: use 1.0 and 0.0"),
        (np.True_, "use 1.0 and 0.0"),
        (math.nan, "finite number, got nan"),
        (np.float32("inf"), "finite number, got np.float32(inf)"),
        (Decimal("NaN"), "finite number, got Decimal('NaN')"),
        ("1.0", "got str '1.0'"),
        (1 + 2j, "got complex"),
        (np.array([1.0, 2.0]), "got ndarray"),
        (10**400, "int too large"),
    ],
)
def test_what_is_not_a_reward_is_a_clear_error(value, says):
    with pytest.raises(ConfigurationError, match="reward must be a finite number") as error:
        check_reward(value)
    assert says in str(error.value)


async def test_numpy_and_decimal_rewards_train(tmp_path):
    kinds = [np.float32, np.int64, Decimal, Fraction]

    def score(example: dict[str, Any], k: int) -> Any:
        return kinds[k % 4](k % 2)

    backend = RecordingBackend()
    trainer = make(tmp_path, Agent(score), backend, train_dataset=dataset(2))
    result = await trainer.step()
    assert result.metrics["exceptions"] == 0 and result.metrics["groups_kept"] == 2
    assert sorted(t.reward for t in backend.calls[0][0][0].trajectories) == [0, 0, 1, 1]


async def test_a_rollout_that_sets_its_reward_and_returns_its_answer(tmp_path):
    """docs/training.md: the reward set on current_trajectory() counts when the rollout
    returns something that is not a number (here, its answer)."""
    agent = Agent()

    async def rollout(example: dict[str, Any]) -> str:
        k = agent.runs[example["id"]]
        agent.runs[example["id"]] += 1
        answer = await agent._solve(example["q"])
        at.current_trajectory().reward = float(k % 2)
        return answer

    backend = RecordingBackend()
    trainer = make(tmp_path, agent, backend, train_dataset=dataset(2))
    trainer.rollout = rollout
    result = await trainer.step()
    assert result.metrics["exceptions"] == 0 and result.metrics["groups_kept"] == 2
    for group in backend.calls[0][0]:
        assert sorted(t.reward for t in group.trajectories) == [0.0, 0.0, 1.0, 1.0]
        assert all(t.messages_and_choices[1].logprobs is not None for t in group.trajectories)


async def test_the_reward_order_and_disagreeing_sources(tmp_path):
    async def returns_answer_no_reward(example: dict[str, Any]) -> str:
        return "forty-two"

    async def returns_bool(example: dict[str, Any]) -> bool:
        return True

    async def sets_and_returns_another(example: dict[str, Any]) -> float:
        at.current_trajectory().reward = 0.0
        return 1.0

    async def sets_and_returns_the_same(example: dict[str, Any]) -> Any:
        at.current_trajectory().reward = 0.1
        return np.float32(0.1)  # the same reward, in float32's precision

    cases = [
        (returns_answer_no_reward, "returned str 'forty-two', which is not a reward"),
        (returns_bool, "returned bool True, which is not a reward"),
        (sets_and_returns_another, "set current_trajectory().reward = 0.0 but the rollout"),
        (sets_and_returns_the_same, None),
    ]
    for i, (rollout, error) in enumerate(cases):
        out = tmp_path / str(i)
        trainer = make(out, Agent(), train_dataset=dataset(1), max_exceptions=1.0)
        trainer.rollout = rollout
        result = await trainer.step()
        if error is None:
            assert result.metrics["exceptions"] == 0
            assert result.metrics["reward_mean"] == pytest.approx(0.1)
        else:
            assert result.metrics["exceptions"] == 4
            assert all(error in message for message in saved_errors(out / "out"))

    async def sets_a_reward(example: dict[str, Any]) -> str:
        at.current_trajectory().reward = 0.5
        return "answer"

    trainer = make(
        tmp_path / "fn",
        Agent(),
        train_dataset=dataset(1),
        max_exceptions=1.0,
        reward_fn=lambda example, output: 1.0,
    )
    trainer.rollout = sets_a_reward
    assert (await trainer.step()).metrics["exceptions"] == 4
    (message, *_) = saved_errors(tmp_path / "fn" / "out")
    assert "reward = 0.5 but reward_fn gave 1.0: give the reward one way" in message


async def test_when_every_rollout_fails_the_error_names_the_most_common_cause(tmp_path):
    calls = [0]

    async def rollout(example: dict[str, Any]) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            raise TimeoutError("the tool timed out")
        return "not a number"

    trainer = make(tmp_path, Agent(), train_dataset=dataset(1), max_concurrency=1)
    trainer.rollout = rollout
    with pytest.raises(at.TrainingError) as error:
        await trainer.step()
    message = str(error.value)
    assert "4 of 4 rollouts raised" in message
    assert "most common cause (3 of 4): ConfigurationError: the rollout returned str" in message
    assert "journal/step-00000/rollouts.jsonl" in message
