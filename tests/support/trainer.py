"""A Trainer on a scripted agent and in-process backends that record what ART would receive,
and a process that holds a run folder's lock."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import art
import httpx
import openai

import arttrace as at
from arttrace.testing import Reply, ScriptedLLM


class RecordingBackend:
    """An in-process backend (ART's Backend protocol): records each train() call."""

    def __init__(self, failures: int = 0) -> None:
        self.calls: list[tuple[list[art.TrajectoryGroup], dict[str, Any]]] = []
        self.failures = failures

    async def register(self, model: Any) -> None:
        pass

    async def _prepare_backend_for_training(self, model: Any, config: Any = None) -> Any:
        return "http://inference.invalid/v1", "key"

    async def train(self, model: Any, groups: Any, **kwargs: Any) -> art.TrainResult:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("backend unavailable")
        self.calls.append((list(groups), kwargs))
        return art.TrainResult(step=len(self.calls), metrics={"loss": 0.5})


class Agent:
    """An instrumented agent on the scripted model; its reward comes from `score(example, k)`.

    In-process by default; ``base_url`` puts it on a server over real HTTP instead."""

    def __init__(self, score: Any = None, base_url: str | None = None) -> None:
        self.llm = ScriptedLLM(lambda r: Reply("answer to " + r["messages"][-1]["content"]))
        self.client = openai.AsyncOpenAI(
            base_url=base_url or "http://scripted/v1",
            api_key="k",
            max_retries=0,
            http_client=None if base_url else httpx.AsyncClient(transport=self.llm.transport()),
        )
        self.runs: Counter[str] = Counter()
        self.finished: Counter[str] = Counter()
        self.cancelled = 0
        self.score = score or (lambda example, k: float(k % 2))

    async def rollout(self, example: dict[str, Any]) -> float:
        k = self.runs[example["id"]]
        self.runs[example["id"]] += 1
        try:
            await self._solve(example["q"])
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.finished[example["id"]] += 1
        return self.score(example, k)

    @at.trainable
    async def _solve(self, question: str) -> str:
        r = await self.client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": question}]
        )
        return r.choices[0].message.content or ""


def journaled(out: Path, step: int) -> list[dict[str, Any]]:
    """The journal's lines for ``step``: ``{"slot": [position, rollout], "trajectory": {...}}``."""
    path = out / "journal" / f"step-{step:05d}" / "rollouts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def dataset(n: int) -> list[dict[str, Any]]:
    return [{"id": f"ex-{i}", "q": f"question {i}"} for i in range(n)]


def make(tmp_path: Path, agent: Agent, backend: Any = None, **kw: Any) -> at.Trainer:
    model = art.TrainableModel(
        name="m",
        project="p",
        base_model="Qwen/Qwen2.5-0.5B-Instruct",
        run_name="r",
        base_path=str(tmp_path / ".art"),
    )
    defaults: dict[str, Any] = {
        "group_size": 4,
        "groups_per_step": 3,
        "output_dir": tmp_path / "out",
        "progress": False,
        "log_to_model": False,
        "retry_delay": 0.001,
    }
    return at.Trainer(model, backend or RecordingBackend(), agent.rollout, **{**defaults, **kw})


class SteppingBackend(RecordingBackend):
    """A RecordingBackend that answers ART's step question (``_get_step``), as ART's do."""

    async def _get_step(self, model: Any) -> int:
        return len(self.calls)


class Hangs(SteppingBackend):
    """A backend whose train never returns, and has trained nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = asyncio.Event()

    async def train(self, model: Any, groups: Any, **kwargs: Any) -> art.TrainResult:
        self.entered.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def hold_lock(folder: Path) -> subprocess.Popen[str]:
    """Another process holding the run folder's lock as the OS knows it (fcntl.flock)."""
    script = (
        "import fcntl, os, sys\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.write(fd, f'{os.getpid()}\\n'.encode())\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n"
    )
    folder.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", script, str(folder / ".lock")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder
