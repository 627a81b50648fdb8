"""A run reaches the worker threads it starts: calls made there are recorded in it."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import queue
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest

import arttrace as at
from arttrace.capture import _guard, _threads
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


def run_id() -> str | None:
    try:
        return at.current_trajectory().example_id
    except at.UsageError:
        return None


def in_thread(fn: Callable[[], object]) -> None:
    """Run ``fn`` in a thread started outside every run (so it carries none), and wait."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=target)
    contextvars.Context().run(thread.start)  # started in an empty context: no run
    thread.join()
    assert not errors, errors


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


def test_each_submit_carries_its_submitters_run_or_none_whatever_worker_runs_it(
    server: Callable[[ScriptedLLM], LLMServer],
) -> None:
    """The pool's worker is started by the first submit, inside run A: later tasks submitted
    outside every run, or in run B, run in no run and in B, while A is still open."""
    llm = ScriptedLLM()
    client = openai.OpenAI(base_url=server(llm).base_url, api_key="k", max_retries=0)
    workers: list[str | None] = []
    pool = ThreadPoolExecutor(1, initializer=lambda: workers.append(run_id()))
    seen: dict[str, str | None] = {}

    def task(name: str) -> None:
        seen[name] = run_id()
        ask(client, name)

    def in_b() -> None:
        with at.trajectory("B") as b:
            pool.submit(task, "B").result()
        seen["B calls"] = ",".join(asked(b))

    with at.trajectory("A") as a:
        pool.submit(task, "A").result()  # starts the pool's only worker, inside A
        in_thread(lambda: pool.submit(task, "nobody").result())
        in_thread(in_b)
    pool.shutdown()
    assert workers == [None]  # the worker itself carries no run
    assert seen == {"A": "A", "nobody": None, "B": "B", "B calls": "B"}
    assert asked(a) == ["A"]
    assert len(llm.requests) == 3


async def test_run_in_executor_outside_a_run_runs_in_no_run(
    server: Callable[[ScriptedLLM], LLMServer],
) -> None:
    client = openai.OpenAI(base_url=server(ScriptedLLM()).base_url, api_key="k", max_retries=0)
    loop = asyncio.get_running_loop()
    pool = ThreadPoolExecutor(1)
    go = asyncio.Event()

    async def outsider() -> str | None:  # a task created before the run: it has none
        await go.wait()
        await loop.run_in_executor(pool, ask, client, "outsider")
        return await loop.run_in_executor(pool, run_id)

    task = asyncio.create_task(outsider())
    async with at.trajectory("A") as a:
        await loop.run_in_executor(pool, ask, client, "A")  # the worker starts inside A
        go.set()
        assert await task is None
    pool.shutdown()
    assert asked(a) == ["A"]


def test_a_thread_subclass_whose_run_is_a_read_only_property_starts_in_a_run(
    server: Callable[[ScriptedLLM], LLMServer],
) -> None:
    client = openai.OpenAI(base_url=server(ScriptedLLM()).base_url, api_key="k", max_retries=0)

    class Frozen(threading.Thread):
        @property
        def run(self) -> Callable[[], None]:
            def go() -> None:
                ask(client, "frozen")

            return go

    with at.trajectory("ex") as t:
        thread = Frozen()
        thread.start()  # arttrace does not assign thread.run: it has no setter
        thread.join()
    assert asked(t) == ["frozen"]


def test_a_thread_that_outlives_its_run_says_so_once(
    server: Callable[[ScriptedLLM], LLMServer], caplog: pytest.LogCaptureFixture
) -> None:
    llm = ScriptedLLM()
    client = openai.OpenAI(base_url=server(llm).base_url, api_key="k", max_retries=0)
    go = threading.Event()
    caught: list[warnings.WarningMessage] = []

    def late() -> None:
        go.wait(5)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            ask(client, "late 1")
            ask(client, "late 2")
        caught.extend(w)

    with at.trajectory("ex") as t:
        thread = threading.Thread(target=late)
        thread.start()
    go.set()
    thread.join()
    assert t.calls == [] and len(llm.requests) == 2  # the calls belong to no run
    (warning,) = [w for w in caught if w.category is at.RunOutlivedWarning]  # once per cause
    text = str(warning.message)
    assert "thread started inside run 'ex' called the model after the run ended" in text
    assert "Join the thread inside the run's `with` block" in text and "arttrace.carry" in text
    assert warning.filename == __file__  # at the caller's line


def test_work_submitted_in_a_run_that_runs_after_it_says_so(
    server: Callable[[ScriptedLLM], LLMServer],
) -> None:
    client = openai.OpenAI(base_url=server(ScriptedLLM()).base_url, api_key="k", max_retries=0)
    go = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        with at.trajectory("ex") as t:
            future = pool.submit(lambda: (go.wait(5), ask(client, "late")))
        go.set()
        with pytest.warns(at.RunOutlivedWarning, match="work submitted inside run 'ex'"):
            future.result()
    assert t.calls == []


def test_a_shared_worker_started_in_one_run_says_so_when_it_serves_another(
    server: Callable[[ScriptedLLM], LLMServer],
) -> None:
    """The pattern arttrace cannot see through (whose work is on a queue): warned once it
    shows, a thread of an ended run still calling while other runs are open."""
    client = openai.OpenAI(base_url=server(ScriptedLLM()).base_url, api_key="k", max_retries=0)
    work: queue.Queue[tuple[str, threading.Event] | None] = queue.Queue()
    caught: list[warnings.WarningMessage] = []

    def consume() -> None:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            while (item := work.get()) is not None:
                ask(client, item[0])
                item[1].set()
        caught.extend(w)

    def submit(text: str) -> None:
        done = threading.Event()
        work.put((text, done))
        done.wait(5)

    with at.trajectory("A") as a:
        consumer = threading.Thread(target=consume)
        consumer.start()  # the mistake: a shared worker started inside one run
        submit("A's work")
        with at.trajectory("B") as b:  # B opens (here, nested for brevity) ...
            submit("B's work, crossed into A")
    with at.trajectory("C") as c:  # ... A has ended, C is open
        submit("C's work")
    work.put(None)
    consumer.join()
    assert asked(a) == ["A's work", "B's work, crossed into A"] and b.calls == c.calls == []
    (warning,) = [w for w in caught if w.category is at.RunOutlivedWarning]
    text = str(warning.message)
    assert "run 'A' is still calling the model after that run ended, while other runs" in text
    assert "Start shared workers outside every run" in text and "arttrace.carry(fn)" in text


def test_carry_hands_a_run_to_a_shared_worker(
    server: Callable[[ScriptedLLM], LLMServer],
) -> None:
    """The rule's fix: the worker is started outside runs, each run hands its work over with
    ``carry``, and the calls record into the run (as policy inside ``@trainable``)."""
    client = openai.OpenAI(base_url=server(ScriptedLLM()).base_url, api_key="k", max_retries=0)
    work: queue.Queue[tuple[Callable[[], Any], threading.Event] | None] = queue.Queue()

    def consume() -> None:
        while (item := work.get()) is not None:
            result = item[0]()
            if asyncio.iscoroutine(result):
                asyncio.run(result)
            item[1].set()

    consumer = threading.Thread(target=consume)
    consumer.start()

    def submit(fn: Callable[[], Any]) -> None:
        done = threading.Event()
        work.put((fn, done))
        done.wait(5)

    async def ask_async() -> None:
        aclient = openai.AsyncOpenAI(base_url=client.base_url, api_key="k", max_retries=0)
        async with aclient:  # one client per event loop: the worker runs each in a new one
            await aclient.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "async"}]
            )

    @at.trainable
    def agent(name: str) -> None:
        submit(at.carry(functools.partial(ask, client, f"{name} policy")))

    runs = []
    for name in ("A", "B"):
        with at.trajectory(name) as t:
            agent(name)
            submit(at.carry(functools.partial(ask, client, f"{name} context")))
            submit(at.carry(ask_async))
        runs.append(t)
    nobody = at.carry(run_id)  # bound outside every run: no run, wherever it is called
    with at.trajectory("C") as c:
        assert nobody() is None
    work.put(None)
    consumer.join()
    for name, t in zip("AB", runs, strict=True):
        assert asked(t) == [f"{name} context", f"{name} policy", "async"]
        assert [c.trainable for c in t.calls] == [True, False, False]
    assert c.calls == []


def test_carry_needs_no_instrument_and_refuses_a_generator_function(
    server: Callable[[ScriptedLLM], LLMServer],
) -> None:
    at.uninstrument()
    try:
        url = server(ScriptedLLM()).base_url
        client = at.wrap_openai(openai.OpenAI(base_url=url, api_key="k", max_retries=0))
        with at.trajectory("ex") as t:
            thread = threading.Thread(target=at.carry(functools.partial(ask, client, "carried")))
            thread.start()
            thread.join()
        assert asked(t) == ["carried"]

        def gen() -> Any:
            yield 1

        with pytest.raises(at.ConfigurationError, match="Carry the function that iterates it"):
            at.carry(gen)
    finally:
        at.instrument()


@pytest.mark.parametrize("fault", ["_here", "_enter"])
def test_a_fault_in_carrying_a_run_never_breaks_start_or_submit(
    server: Callable[[ScriptedLLM], LLMServer],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    fault: str,
) -> None:
    """The work runs, without the run; the failure is logged (once per place)."""
    llm = ScriptedLLM()
    client = openai.OpenAI(base_url=server(llm).base_url, api_key="k", max_retries=0)

    def boom(*args: object) -> Any:
        raise RuntimeError(f"fault injected into {fault}")

    monkeypatch.setattr(_threads, fault, boom)
    monkeypatch.setattr(_guard, "_logged", set())
    with at.trajectory("ex"), ThreadPoolExecutor(1) as pool:
        assert pool.submit(ask, client, "submitted").result() == "You said: submitted"
        thread = Worker(client, "thread")
        thread.start()
        thread.join()
    assert len(llm.requests) == 2
    assert any(
        r.levelno == logging.ERROR and r.exc_info and "fault injected" in str(r.exc_info[1])
        for r in caplog.records
    )
