"""What the HTTP-client layer costs per call: raw httpx, recorded by arttrace below every SDK,
against the same client uninstrumented, in the same run.

    python bench/bench_transport.py            # about a minute on 2 cores
    python bench/bench_transport.py --quick    # about 15 seconds, rougher figures

Every call posts a Chat Completions request with ``httpx`` (sync ``Client`` and async
``AsyncClient``) to the same in-process ``ScriptedLLM`` transport (an ``httpx.MockTransport``
answering like vLLM) and gets a 256-token completion with logprobs and token ids (the request
asks for them itself, so every arm gets the same answer); streams send one token per chunk and
are read to the end with ``iter_bytes``. Three arms, visited in an order rotated every round so
they share the machine's drift and load:

- ``plain``: the bare call, arttrace uninstrumented;
- ``scopes only``: the same call inside ``with at.trajectory(...)`` and a ``@at.trainable``
  function, uninstrumented (what the scopes cost without any capture);
- ``arttrace``: the same, instrumented: the HTTP layer records the call (it reads the JSON or
  the server-sent events on the side and parses them into the record the trajectory keeps).

A last figure is what the hook costs a call it lets pass (the OpenAI SDK path: the shim has
set ``_context.capturing``, so the layer stands aside): a small ``send`` through the hooked
httpx against the unhooked one, in thread CPU time (steadier than wall time on a busy machine),
interleaved.

The figures are per-call wall times (median and 10th percentile over rounds) and two paired
ratios: ``arttrace / plain`` (what a user of raw httpx pays) and ``arttrace / scopes only``
(the layer alone). An in-process transport has no network latency, so the ratios are the
worst case: against a real server the same absolute cost is a small part of each call.

It prints figures and always exits 0; a call the arttrace arm failed to record as one
trainable 256-token turn is shown as a failed check. It is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import inspect
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

import arttrace as at
from arttrace.testing import Reply, ScriptedLLM

URL = "http://llm.test/v1/chat/completions"
COMPLETION_TOKENS = 256
CONTENT = " ".join(f"w{i}" for i in range(128))  # 255 tokens with SimpleChatTokenizer, + end
ARMS = ("plain", "scopes only", "arttrace")


def body(stream: bool) -> dict[str, Any]:
    """A fresh request each call, asking for the training fields itself."""
    request: dict[str, Any] = {
        "model": "policy",
        "messages": [{"role": "user", "content": "Hi"}],
        "logprobs": True,
        "return_token_ids": True,
    }
    if stream:
        request["stream"] = True
    return request


Block = Callable[[int], "tuple[float, Any] | Awaitable[tuple[float, Any]]"]


def sync_blocks(client: httpx.Client, stream: bool) -> dict[str, Block]:
    def call() -> int:
        if not stream:
            return len(client.post(URL, json=body(False)).content)
        with client.stream("POST", URL, json=body(True)) as response:
            return sum(len(piece) for piece in response.iter_bytes())

    policy = at.trainable(name="policy")(call)

    def plain(k: int) -> tuple[float, Any]:
        start = time.perf_counter()
        for _ in range(k):
            call()
        return (time.perf_counter() - start) / k, None

    def scoped(k: int) -> tuple[float, Any]:
        start = time.perf_counter()
        for i in range(k):
            with at.trajectory(i) as t:
                policy()
        return (time.perf_counter() - start) / k, t

    return {"plain": plain, "scopes only": scoped, "arttrace": scoped}


def async_blocks(client: httpx.AsyncClient, stream: bool) -> dict[str, Block]:
    async def call() -> int:
        if not stream:
            return len((await client.post(URL, json=body(False))).content)
        async with client.stream("POST", URL, json=body(True)) as response:
            return sum([len(piece) async for piece in response.aiter_bytes()])

    policy = at.trainable(name="policy")(call)

    async def plain(k: int) -> tuple[float, Any]:
        start = time.perf_counter()
        for _ in range(k):
            await call()
        return (time.perf_counter() - start) / k, None

    async def scoped(k: int) -> tuple[float, Any]:
        start = time.perf_counter()
        for i in range(k):
            async with at.trajectory(i) as t:
                await policy()
        return (time.perf_counter() - start) / k, t

    return {"plain": plain, "scopes only": scoped, "arttrace": scoped}


def check(arm: str, last: Any, failures: list[str], label: str) -> None:
    if arm == "plain":
        return
    calls = last.calls
    if arm == "scopes only":
        if calls:
            failures.append(f"{label}: recorded a call uninstrumented")
        return
    ok = len(calls) == 1 and calls[0].source == "http"
    if ok:
        call = calls[0]
        ok = (
            call.trainable
            and call.completion_tokens == COMPLETION_TOKENS
            and not any(call.untrainable_reason(c) for c in call.choices)
        )
    if not ok:
        failures.append(f"{label}: arttrace did not record one trainable 256-token call")


def run(loop: asyncio.AbstractEventLoop, out: Any) -> tuple[float, Any]:
    if inspect.isawaitable(out):
        out = loop.run_until_complete(out)
    return out  # type: ignore[no-any-return]


def use(arm: str) -> None:
    if arm == "arttrace":
        at.instrument()
    else:
        at.uninstrument()


def time_mode(
    loop: asyncio.AbstractEventLoop,
    llm: ScriptedLLM,
    label: str,
    blocks: dict[str, Block],
    calls: int,
    rounds: int,
    failures: list[str],
) -> dict[str, list[float]]:
    for arm in ARMS:  # warm-up, checked
        use(arm)
        check(arm, run(loop, blocks[arm](2))[1], failures, label)
    seconds: dict[str, list[float]] = {arm: [] for arm in ARMS}
    gc.collect()
    gc.disable()
    try:
        for r in range(rounds):
            for arm in ARMS[r % len(ARMS) :] + ARMS[: r % len(ARMS)]:
                use(arm)
                per_call, last = run(loop, blocks[arm](calls))
                seconds[arm].append(per_call)
                check(arm, last, failures, label)
            llm.requests.clear()
            gc.collect()
    finally:
        gc.enable()
        at.uninstrument()
    return seconds


def paired(seconds: dict[str, list[float]], arm: str, base: str) -> float:
    return statistics.median(a / b for a, b in zip(seconds[arm], seconds[base], strict=True))


def pass_through(rounds: int, calls: int) -> tuple[float, float]:
    """Thread CPU µs per ``send`` that the layer lets pass, unhooked and hooked (medians)."""
    from arttrace.capture import _context

    client = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(200)))
    request = client.build_request("POST", URL, json=body(False))
    figures: dict[bool, list[float]] = {False: [], True: []}
    token = _context.capturing.set(True)  # as while the shim records an SDK call
    try:
        for r in range(rounds * 4):
            for hooked in (r % 2 == 0, r % 2 == 1):
                if hooked:
                    at.instrument()
                else:
                    at.uninstrument()
                start = time.thread_time()
                for _ in range(calls * 20):
                    client.send(request)
                figures[hooked].append((time.thread_time() - start) / (calls * 20))
    finally:
        _context.capturing.reset(token)
        at.uninstrument()
        client.close()
    return statistics.median(figures[False]) * 1e6, statistics.median(figures[True]) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, rougher figures")
    args = parser.parse_args()
    rounds, calls = (8, 10) if args.quick else (24, 20)
    llm = ScriptedLLM(lambda request: Reply(CONTENT))
    transport = llm.transport()
    loop = asyncio.new_event_loop()
    sync_client = httpx.Client(transport=transport)
    async_client = httpx.AsyncClient(transport=transport)
    modes = {
        "sync whole": sync_blocks(sync_client, False),
        "sync stream": sync_blocks(sync_client, True),
        "async whole": async_blocks(async_client, False),
        "async stream": async_blocks(async_client, True),
    }
    print(
        f"bench_transport: python {platform.python_version()}, httpx {httpx.__version__}, "
        f"{rounds} rounds x {calls} calls per arm and mode, {COMPLETION_TOKENS}-token completions"
    )
    failures: list[str] = []
    results = {
        label: time_mode(loop, llm, label, blocks, calls, rounds, failures)
        for label, blocks in modes.items()
    }
    loop.run_until_complete(async_client.aclose())
    sync_client.close()
    loop.close()
    print("\nPer-call wall time, µs: median [10th percentile] over rounds")
    print(f"  {'mode':<14}" + "".join(f"{a:>20}" for a in ARMS))
    for label, seconds in results.items():
        cells = "".join(
            f"{statistics.median(s) * 1e6:>11.0f} [{statistics.quantiles(s, n=10)[0] * 1e6:>5.0f}]"
            for s in seconds.values()
        )
        print(f"  {label:<14}{cells}")
    print("\nPaired ratios (median over rounds of each round's ratio)")
    print(f"  {'mode':<14}{'arttrace/plain':>16}{'arttrace/scopes':>17}{'layer µs/call':>15}")
    for label, seconds in results.items():
        layer = statistics.median(
            a - b for a, b in zip(seconds["arttrace"], seconds["scopes only"], strict=True)
        )
        print(
            f"  {label:<14}{paired(seconds, 'arttrace', 'plain'):>16.2f}"
            f"{paired(seconds, 'arttrace', 'scopes only'):>17.2f}{layer * 1e6:>15.0f}"
        )
    plain, hooked = pass_through(rounds, calls)
    print(
        f"\nA call the layer lets pass (the OpenAI SDK path), thread CPU µs per send: "
        f"{plain:.1f} unhooked, {hooked:.1f} hooked (+{hooked - plain:.1f})"
    )
    print(f"\nchecks: {'all passed' if not failures else 'FAILED'}")
    for failure in failures[:10]:
        print(f"  {failure}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
