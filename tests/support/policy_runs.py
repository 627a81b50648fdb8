"""Shared by the tests that train two policies through a real framework or transport: a
backend that records what each model was sent, and the check that each policy's trajectories
hold exactly its own turns as trainable Choices (with the ids and logprobs the server sent for
them) and every other policy's turns as context."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import art
from openai.types.chat.chat_completion import Choice

from support.trainer import RecordingBackend


def model(name: str, tmp_path: Path) -> art.TrainableModel[Any]:
    return art.TrainableModel(
        name=name,
        project="p",
        base_model="Qwen/Qwen2.5-0.5B-Instruct",
        run_name="r",
        base_path=str(tmp_path / ".art"),
    )


class Killed(BaseException):
    """The process dying at this point (nothing after it runs, nothing catches it)."""


class ModelsBackend(RecordingBackend):
    """Records which model each train() call trained (its loss: the model name's length),
    and answers ART's step question per model; ``killed_on``: the model whose training the
    process dies in (once)."""

    def __init__(self, killed_on: str | None = None) -> None:
        super().__init__()
        self.trained: list[tuple[str, list[art.TrajectoryGroup]]] = []
        self.killed_on = killed_on

    async def train(self, model: Any, groups: Any, **kwargs: Any) -> art.TrainResult:
        if model.name == self.killed_on:
            self.killed_on = None
            raise Killed
        self.trained.append((model.name, list(groups)))
        return art.TrainResult(step=len(self.trained), metrics={"loss": len(model.name)})

    async def _get_step(self, model: Any) -> int:
        return sum(name == model.name for name, _ in self.trained)

    def groups(self, name: str) -> list[art.TrajectoryGroup]:
        return [g for trained, groups in self.trained if trained == name for g in groups]


@dataclass(frozen=True)
class Answer:
    """One Chat Completions answer as the server sent it."""

    model: str
    prompt: list[int]
    ids: list[int]
    logprobs: list[float]
    content: str
    tools: list[str]
    """The names of the tools it called."""


def answer(model: str, data: bytes, streamed: bool) -> Answer:
    """The answer in ``data`` (a whole JSON body or an SSE stream) to a call to ``model``."""
    if not streamed:
        whole = json.loads(data)
        (choice,) = whole["choices"]
        return Answer(
            model,
            whole["prompt_token_ids"],
            choice["token_ids"],
            [t["logprob"] for t in choice["logprobs"]["content"]],
            choice["message"].get("content") or "",
            [c["function"]["name"] for c in choice["message"].get("tool_calls") or ()],
        )
    events = [json.loads(line[6:]) for line in data.splitlines() if line.startswith(b"data: {")]
    choices = [c for e in events for c in e["choices"]]
    return Answer(
        model,
        next(e["prompt_token_ids"] for e in events if e.get("prompt_token_ids")),
        [i for c in choices for i in c.get("token_ids") or ()],
        [t["logprob"] for c in choices if c.get("logprobs") for t in c["logprobs"]["content"]],
        "".join(c["delta"].get("content") or "" for c in choices),
        [
            tc["function"]["name"]
            for c in choices
            for tc in c["delta"].get("tool_calls") or ()
            if (tc.get("function") or {}).get("name")
        ],
    )


def kept_answers(requests: list[dict[str, Any]], kept: list[tuple[bytes, bool]]) -> list[Answer]:
    """A :class:`~support.served.KeptLLM`'s answers, each with the model it was asked for."""
    return [answer(r["model"], *sent) for r, sent in zip(requests, kept, strict=True)]


def items(trajectory: art.Trajectory) -> list[Any]:
    """Its messages and choices, of every history."""
    histories = [trajectory, *trajectory.additional_histories]
    return [item for h in histories for item in h.messages_and_choices]


def check_policies(
    backend: ModelsBackend,
    served: list[Answer],
    turns: dict[str, int],
    *,
    groups: int,
    group_size: int,
) -> None:
    """Each model in ``turns`` (model name -> its turns in one run) got ``groups`` groups of
    ``group_size`` trajectories, each holding exactly its own turns as trainable Choices
    carrying the ids and logprobs the server sent for them, and each of the other models'
    turns as a context message."""
    assert sorted(name for name, _ in backend.trained) == sorted(turns)
    by_ids = {(tuple(a.prompt), tuple(a.ids)): a for a in served}
    assert len(by_ids) == len(served), "each answer its own tokens (unique texts per run)"
    for name, own in turns.items():
        trained = backend.groups(name)
        assert len(trained) == groups
        assert all(len(g.trajectories) == group_size for g in trained)
        for t in (t for g in trained for t in g.trajectories):
            chosen = [i for i in items(t) if isinstance(i, Choice)]
            assert len(chosen) == own, (name, t)
            for choice in chosen:
                extra = choice.model_extra or {}
                sent = by_ids[tuple(extra["prompt_token_ids"]), tuple(extra["token_ids"])]
                assert sent.model == name  # its own turn, with the server's tokens
                assert choice.logprobs is not None
                assert [p.logprob for p in choice.logprobs.content or ()] == sent.logprobs
            # the other models' turns, as context (a turn also reappears as context where a
            # later call's prompt repeats it, e.g. after a handoff changed the instructions)
            said = {
                (i.get("content") or "", tuple(c["function"]["name"] for c in i["tool_calls"]))
                if i.get("tool_calls")
                else (i.get("content") or "", ())
                for i in items(t)
                if isinstance(i, dict) and i["role"] == "assistant"
            }
            answers = {(a.content, tuple(a.tools)): a.model for a in served}
            assert said <= answers.keys(), (name, said)
            others = [s for s in said if answers[s] != name]
            assert len(others) == sum(n for m, n in turns.items() if m != name), (name, said)


def journaled_policies(out: Path, step: int = 0) -> set[tuple[str, str | None]]:
    """The (model, policy) of every call the Trainer journaled for ``step``."""
    path = out / "journal" / f"step-{step:05d}" / "rollouts.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return {(c["model"], c["policy"]) for line in lines for c in line["trajectory"]["calls"]}
