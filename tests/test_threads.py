"""A run reaches the worker threads it starts: calls made there are recorded in it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

import arttrace as at
from arttrace.testing import LLMServer, ScriptedLLM

pytestmark = pytest.mark.usefixtures("instrumented")


def ask(client: openai.OpenAI, text: str) -> str:
    reply = client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": text}]
    )
    return reply.choices[0].message.content or ""


class Worker(threading.Thread):
    """A thread subclass that overrides run(), as much user code does."""

    def __init__(self, client: openai.OpenAI, text: str) -> None:
        super().__init__()
        self.client, self.text = client, text

    def run(self) -> None:
        ask(self.client, self.text)


def asked(t: at.Trajectory) -> list[str]:
    return sorted(c.messages[-1]["content"] for c in t.calls)


def test_every_kind_of_thread_started_in_a_run_records_into_it(
    server: Callable[[ScriptedLLM], LLMServer],
) -> None:
    client = openai.OpenAI(base_url=server(ScriptedLLM()).base_url, api_key="k", max_retries=0)

    @at.trainable(name="agent")
    def agent() -> None:
        with ThreadPoolExecutor(2) as pool:
            pool.submit(ask, client, "submitted").result()
        plain = threading.Thread(target=ask, args=(client, "thread"))
        plain.start()
        plain.join()
        sub = Worker(client, "subclass")
        sub.start()
        sub.join()

    with at.trajectory("threads") as t:
        agent()
        t.reward = 1.0
    assert asked(t) == ["subclass", "submitted", "thread"]
    assert [(c.trainable, c.agent) for c in t.calls] == [(True, "agent")] * 3
    assert t.trainable_turns == 3


async def test_run_in_executor_and_to_thread_record_into_the_run(
    server: Callable[[ScriptedLLM], LLMServer],
) -> None:
    client = openai.OpenAI(base_url=server(ScriptedLLM()).base_url, api_key="k", max_retries=0)
    loop = asyncio.get_running_loop()

    @at.trainable
    async def agent() -> None:
        await loop.run_in_executor(None, ask, client, "executor")
        await asyncio.to_thread(ask, client, "to_thread")

    async with at.trajectory("executor") as t:
        await agent()
    assert asked(t) == ["executor", "to_thread"]
    assert all(c.trainable for c in t.calls)


async def test_concurrent_runs_keep_their_own_thread_calls(
    server: Callable[[ScriptedLLM], LLMServer],
) -> None:
    client = openai.OpenAI(base_url=server(ScriptedLLM()).base_url, api_key="k", max_retries=0)
    loop = asyncio.get_running_loop()
    pool = ThreadPoolExecutor(4)  # shared by every run, as a real app's pool would be

    @at.trainable
    async def agent(i: int) -> None:
        await loop.run_in_executor(pool, ask, client, f"{i}-pool")
        await loop.run_in_executor(None, ask, client, f"{i}-default")
        worker = Worker(client, f"{i}-thread")
        worker.start()
        await asyncio.to_thread(worker.join)

    async def run(i: int) -> at.Trajectory:
        async with at.trajectory(f"ex-{i}") as t:
            await agent(i)
        return t

    runs = await asyncio.gather(*(run(i) for i in range(24)))
    pool.shutdown()
    for i, t in enumerate(runs):
        assert asked(t) == [f"{i}-default", f"{i}-pool", f"{i}-thread"]


def test_a_thread_started_outside_a_run_records_nothing(
    server: Callable[[ScriptedLLM], LLMServer],
) -> None:
    llm = ScriptedLLM()
    client = openai.OpenAI(base_url=server(llm).base_url, api_key="k", max_retries=0)
    pool = ThreadPoolExecutor(1)
    go = threading.Event()
    outside = threading.Thread(target=lambda: (go.wait(5), ask(client, "outside")))
    outside.start()  # started before any run: it belongs to none
    with at.trajectory("inside") as t:
        go.set()
        outside.join()
        pool.submit(ask, client, "inside").result()
    pool.submit(ask, client, "after").result()  # the pool's thread keeps no run of its own
    pool.shutdown()
    assert asked(t) == ["inside"]
    assert len(llm.requests) == 3


def test_uninstrument_restores_thread_start_and_submit() -> None:
    at.uninstrument()
    plain = (threading.Thread.start, ThreadPoolExecutor.submit)
    at.instrument()
    assert threading.Thread.start is not plain[0] and ThreadPoolExecutor.submit is not plain[1]
    at.uninstrument()
    assert (threading.Thread.start, ThreadPoolExecutor.submit) == plain
    at.instrument()


def test_another_librarys_patch_over_ours_survives_uninstrument() -> None:
    ours = ThreadPoolExecutor.submit
    seen: list[object] = []

    def other_submit(self: ThreadPoolExecutor, fn: Callable[[], str]) -> object:
        seen.append(fn)
        return ours(self, fn)

    ThreadPoolExecutor.submit = other_submit  # type: ignore[assignment]
    try:
        at.uninstrument()
        assert ThreadPoolExecutor.submit is other_submit  # theirs stays; ours, under it, is inert
        with ThreadPoolExecutor(1) as pool, at.trajectory("off"):
            assert pool.submit(at.current_trajectory).exception() is not None
        at.instrument()  # ours is still in the chain: not stacked again (no recursion)
        with ThreadPoolExecutor(1) as pool, at.trajectory("on"):
            assert pool.submit(lambda: at.current_trajectory().example_id).result() == "on"
        assert len(seen) == 2
    finally:
        ThreadPoolExecutor.submit = ours  # type: ignore[method-assign]
        at.instrument()
