"""What a group reward (RULER) adds to a training step.

One step of 8 groups x 8 runs: an instrumented OpenAI-SDK agent (two LLM calls per run, a tool
call in between) against arttrace.testing's server on 127.0.0.1, a backend that returns at
once, and three arms measured in the same rounds, in turn:

- ``none``: no group reward (the baseline);
- ``ruler 0 ms``: ``group_reward=arttrace.rewards.ruler(...)`` with a judge (arttrace.testing's
  server too) that answers at once;
- ``ruler 500 ms``: the same judge answering each call after 500 ms.

The policy server answers at once (``--policy-ms 0``: a step is nearly all the Trainer's own
work, the worst case for any added cost) or after a delay per call, as a real model does, so
the judging overlaps rollouts. Both servers run in their own processes: this process's CPU
time is the Trainer's, the agent's and the judge client's. Each figure is the median over
the rounds; ratios are against ``none`` of the same rounds.

    python bench/bench_rewards.py [--rounds N] [--policy-ms 0,100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from typing import TYPE_CHECKING

import openai

import arttrace as at
from arttrace._journal import Journal
from arttrace.rewards import ruler
from arttrace.testing import Reply, ScriptedLLM, ToolCall, serve

if TYPE_CHECKING:  # ART loads when used: the servers' processes import this module too
    import art

GROUPS, GROUP_SIZE = 8, 8
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


class InstantBackend:
    async def register(self, model: Any) -> None:
        pass

    async def train(self, model: Any, groups: Any, **kwargs: Any) -> art.TrainResult:
        import art

        return art.TrainResult(step=1, metrics={})


def policy(delay: float, request: dict[str, Any]) -> Reply:
    time.sleep(delay)
    last = request["messages"][-1]
    if last["role"] == "tool":
        return Reply(f"The answer is {last['content']}. " + "Some more words to answer. " * 8)
    return Reply("Let me look it up.", tool_calls=[ToolCall("lookup", {"q": last["content"]})])


def judge(delay: float, request: dict[str, Any]) -> Reply:
    time.sleep(delay)
    ids = re.search(r"each of these run ids: ([\d, ]+)\.", request["messages"][0]["content"])
    assert ids
    return Reply(judge_answer(ids[1].split(", ")))


def judge_answer(ids: list[str]) -> str:
    scores = [
        {"run_id": i, "explanation": "Reached the goal in two steps.", "score": int(i) / 10}
        for i in ids
    ]
    return json.dumps({"scores": scores})


def run_server(kind: str, delay: float, port: Any) -> None:
    """A scripted server in its own process, so its CPU time is not the trainer's."""
    responder = policy if kind == "policy" else judge
    with serve(ScriptedLLM(lambda request: responder(delay, request))) as server:
        port.put(server.base_url)
        while True:
            time.sleep(3600)


_servers: list[multiprocessing.Process] = []


def start(kind: str, delay: float) -> tuple[multiprocessing.Process, str]:
    context = multiprocessing.get_context("spawn")
    port = context.Queue()
    process = context.Process(target=run_server, args=(kind, delay, port), daemon=True)
    process.start()
    _servers.append(process)
    return process, port.get(timeout=120)


class Agent:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.client: openai.AsyncOpenAI | None = None

    async def rollout(self, example: dict[str, Any]) -> float:
        if self.client is None:
            self.client = openai.AsyncOpenAI(base_url=self.base_url, api_key="k", max_retries=0)
        await self.solve(self.client, example["q"])
        return float(int(str(at.current_trajectory().metadata["rollout"])) % 2)

    @at.trainable
    async def solve(self, client: openai.AsyncOpenAI, question: str) -> str:
        messages: list[Any] = [
            {"role": "system", "content": "You answer questions with the lookup tool."},
            {"role": "user", "content": question},
        ]
        first = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = first.choices[0].message
        call = (message.tool_calls or [])[0]
        messages += [
            message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "42"},
        ]
        second = await client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS
        )
        return second.choices[0].message.content or ""


def trainer(root: Path, name: str, agent: Agent, group_reward: Any) -> at.Trainer[Any]:
    import art

    model = art.TrainableModel(
        name=name, project="p", base_model="Qwen/Qwen2.5-0.5B-Instruct", run_name="r"
    )
    dataset = [{"id": f"q-{i}", "q": f"What is the answer to question {i}?"} for i in range(8)]
    return at.Trainer(
        model,
        InstantBackend(),  # type: ignore[arg-type]
        agent.rollout,
        dataset,
        group_size=GROUP_SIZE,
        groups_per_step=GROUPS,
        max_concurrency=GROUPS * GROUP_SIZE,
        group_reward=group_reward,
        output_dir=root / name,
        progress=False,
        log_to_model=False,
    )


async def measure(rounds: int, policy_ms: float, judge_urls: dict[str, str]) -> None:
    _, policy_url = start("policy", policy_ms / 1000)
    agent = Agent(policy_url)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        judges = {
            name: ruler(model="judge", base_url=url, api_key="k")
            for name, url in judge_urls.items()
        }
        arms = {
            "none": trainer(root, "none", agent, None),
            **{name: trainer(root, name.replace(" ", "-"), agent, j) for name, j in judges.items()},
        }
        for t in arms.values():  # warm up: connections, first-step imports
            await t.step()
        walls: dict[str, list[float]] = {name: [] for name in arms}
        cpus: dict[str, list[float]] = {name: [] for name in arms}
        tails: dict[str, list[float]] = {name: [] for name in arms}
        """From the step's last run ending to the step returning: judging's place on the
        critical path, without the rollouts' noise."""
        judged: dict[str, list[dict[str, float]]] = {name: [] for name in arms}
        for r in range(rounds):
            order = list(arms)[r % len(arms) :] + list(arms)[: r % len(arms)]
            for name in order:
                cpu, wall = time.process_time(), time.perf_counter()
                result = await arms[name].step()
                walls[name].append(time.perf_counter() - wall)
                cpus[name].append(time.process_time() - cpu)
                ended = time.time()
                runs = arms[name].journal.finished(result.step).values()
                tails[name].append(ended - max(t.ended_at or 0.0 for t in runs))
                judged[name].append(result.metrics)
        render_us, parse_us = judge_cpu(arms["ruler 0 ms"], judges["ruler 0 ms"])
        call_us, call_wall = await judged_group_cpu(arms["ruler 0 ms"], judges["ruler 0 ms"])
        for j in judges.values():
            await j.aclose()
        if agent.client is not None:
            await agent.client.close()
    print(f"\npolicy answering in {policy_ms:g} ms per call; {GROUPS} groups x {GROUP_SIZE} runs")
    base_wall, base_cpu = statistics.median(walls["none"]), statistics.median(cpus["none"])
    print(
        f"{'arm':<14}{'wall s':>9}{'x none':>8}{'+wall s':>9}{'cpu s':>8}{'x none':>8}"
        f"{'+cpu ms':>9}{'tail s':>8}{'+tail s':>9}{'call s':>8}{'prompt tok':>12}"
        f"{'compl tok':>11}{'calls':>7}"
    )
    base_tail = statistics.median(tails["none"])
    for name in arms:
        wall, cpu = statistics.median(walls[name]), statistics.median(cpus[name])
        m = judged[name][-1]
        call = (
            statistics.median(
                x["judge_seconds"] / x["judge_calls"] for x in judged[name] if x.get("judge_calls")
            )
            if m.get("judge_calls")
            else 0.0
        )
        print(
            f"{name:<14}{wall:>9.3f}{wall / base_wall:>8.2f}{wall - base_wall:>9.3f}"
            f"{cpu:>8.3f}{cpu / base_cpu:>8.2f}{(cpu - base_cpu) * 1000:>9.1f}"
            f"{statistics.median(tails[name]):>8.3f}"
            f"{statistics.median(tails[name]) - base_tail:>9.3f}{call:>8.3f}"
            f"{m.get('judge_prompt_tokens', 0):>12.0f}{m.get('judge_completion_tokens', 0):>11.0f}"
            f"{m.get('judge_calls', 0):>7.0f}"
        )
    print(
        f"the judge's work in this process, per group of {GROUP_SIZE} runs: rendering the "
        f"prompt {render_us:.0f} us CPU, parsing and checking the answer {parse_us:.0f} us CPU; "
        f"a whole judge call (0 ms judge, {GROUPS} at once, as a step makes them) "
        f"{call_us:.0f} us CPU per group, {call_wall * 1000:.0f} ms wall per {GROUPS}"
    )


async def judged_group_cpu(
    trainer: at.Trainer[Any], judge: Any, rounds: int = 20
) -> tuple[float, float]:
    """This process's CPU microseconds per judged group for whole judge calls (render, the
    OpenAI client's request and response, parse and check), ``GROUPS`` calls at once as a
    step makes them, and the median wall seconds of each batch of ``GROUPS``."""
    runs = Journal(trainer.output_dir).finished(0)
    group = at.Group(
        "q-0", None, 0, tuple(at.GroupRun(k, runs[(0, k)], 0.0) for k in range(GROUP_SIZE))
    )
    walls = []
    started = time.process_time()
    for _ in range(rounds):
        wall = time.perf_counter()
        await asyncio.gather(*(judge(group) for _ in range(GROUPS)))
        walls.append(time.perf_counter() - wall)
    cpu = (time.process_time() - started) / (rounds * GROUPS) * 1e6
    return cpu, statistics.median(walls)


def judge_cpu(trainer: at.Trainer[Any], judge: Any, n: int = 100) -> tuple[float, float]:
    """CPU microseconds per group to render a journaled group's prompt, and to parse and check
    a judge's answer to it (the rest of a judge's cost is its server's)."""
    from arttrace.rewards._ruler import parse_scores

    runs = Journal(trainer.output_dir).finished(0)
    group = at.Group(
        "q-0",
        None,
        0,
        tuple(at.GroupRun(k, runs[(0, k)], 0.0) for k in range(GROUP_SIZE)),
    )
    ids = [str(i) for i in range(1, GROUP_SIZE + 1)]
    answer = judge_answer(ids)
    started = time.process_time()
    for _ in range(n):
        judge.messages(group)
    render = (time.process_time() - started) / n * 1e6
    started = time.process_time()
    for _ in range(n):
        parse_scores(answer, ids)
    return render, (time.process_time() - started) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--policy-ms", default="0,100", help="policy delays per call, ms")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: stop the servers too
    try:
        run(args)
    finally:
        for process in _servers:
            process.terminate()


def run(args: argparse.Namespace) -> None:
    at.instrument()
    judges = {
        name: start("judge", ms / 1000)[1]
        for name, ms in (("ruler 0 ms", 0), ("ruler 500 ms", 500))
    }
    print(f"load average before: {os.getloadavg()}")
    for ms in (float(x) for x in args.policy_ms.split(",")):
        asyncio.run(measure(args.rounds, ms, judges))
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
