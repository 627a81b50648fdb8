"""What the gateway adds to a call: latency, CPU, and memory per captured token.

    python bench/bench_gateway.py                       # ~1-2 minutes on 2 idle cores
    python bench/bench_gateway.py --quick               # fewer calls, rougher figures
    python bench/bench_gateway.py --concurrency 1000    # the high-concurrency round's size

The upstream is arttrace's scripted vLLM-like server in a process of its own, on loopback. Each
call streams a 64-token completion (one token per chunk, logprobs and token ids, as vLLM sends
them). In the same run, the same client calls the upstream directly and through the gateway
(an ``arttrace.Gateway`` in this process, each call in its own trajectory), alternating, so
both arms share the machine's load. Reported:

(a) time to first byte and to last byte, p50 and p99, direct and through the gateway, at 1
    stream and at ``--concurrency`` streams at once; the added latency is gateway - direct.
    Targets at 1 stream: p50 added <= 1 ms, p99 added <= 5 ms.
(b) the gateway's CPU per call (its thread's CPU time over the calls it served).
(c) memory kept per captured token by the finished trajectories (tracemalloc), target <= 32 B.

It prints figures and PASS/MISS markers and exits 0; it is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import httpx

import arttrace as at
from arttrace.gateway import Gateway

TOKENS, LONG = 64, 256
CONTENT = " ".join(f"w{i}" for i in range(TOKENS // 2))  # 32 words + 31 spaces + end token
LONG_CONTENT = " ".join(f"w{i}" for i in range(LONG // 2))
TARGET_P50_MS, TARGET_P99_MS, TARGET_BYTES = 1.0, 5.0, 32.0
UPSTREAM = f"""
import sys
from arttrace.testing import ScriptedLLM, serve
long = lambda request: request["messages"][-1]["content"] == "long"
server = serve(ScriptedLLM(lambda request: {LONG_CONTENT!r} if long(request) else {CONTENT!r}))
print(server.base_url, flush=True)
sys.stdin.read()
"""
BODY = {
    "model": "policy",
    "messages": [{"role": "user", "content": "Hi"}],
    "stream": True,
    "logprobs": True,
    "return_token_ids": True,
}

LONG_BODY = {**BODY, "messages": [{"role": "user", "content": "long"}]}


async def one_call(
    client: httpx.AsyncClient, url: str, body: dict[str, Any] = BODY
) -> tuple[float, float]:
    """(seconds to the first body byte, seconds to the last) of one streamed call."""
    started = time.perf_counter()
    first = None
    async with client.stream("POST", f"{url}/chat/completions", json=body) as response:
        async for _ in response.aiter_raw():
            if first is None:
                first = time.perf_counter()
    end = time.perf_counter()
    assert response.status_code == 200 and first is not None
    return first - started, end - started


async def through_gateway(client: httpx.AsyncClient, gateway: Gateway) -> tuple[float, float]:
    async with at.trajectory("bench") as t:
        timing = await one_call(client, gateway.url(t))
    assert t.trainable_turns == 1, t.calls
    return timing


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def thread_cpu(native_id: int) -> float:
    """CPU seconds of one thread of this process (Linux)."""
    fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def report(name: str, direct: list[tuple[float, float]], via: list[tuple[float, float]]) -> None:
    print(f"\n{name}: {len(direct)} calls per arm, ms")
    print(f"  {'':22}{'p50':>10}{'p99':>10}")
    added = {}
    for k, label in ((0, "first byte"), (1, "last byte")):
        d, g = [x[k] * 1e3 for x in direct], [x[k] * 1e3 for x in via]
        print(f"  {label + ', direct':22}{pct(d, 50):10.1f}{pct(d, 99):10.1f}")
        print(f"  {label + ', gateway':22}{pct(g, 50):10.1f}{pct(g, 99):10.1f}")
        added[label] = (pct(g, 50) - pct(d, 50), pct(g, 99) - pct(d, 99))
        print(f"  {label + ', added':22}{added[label][0]:10.2f}{added[label][1]:10.2f}")
    if name.startswith("1 stream"):
        for label, (p50, p99) in added.items():
            verdict = "PASS" if p50 <= TARGET_P50_MS and p99 <= TARGET_P99_MS else "MISS"
            print(
                f"  added {label}: p50 {p50:.2f} ms (target <= {TARGET_P50_MS}), "
                f"p99 {p99:.2f} ms (target <= {TARGET_P99_MS})  {verdict}"
            )


async def sequential(
    client: httpx.AsyncClient, upstream: str, gateway: Gateway, calls: int
) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    direct, via = [], []
    for i in range(calls):  # alternate, so both arms see the same drift
        if i % 2:
            via.append(await through_gateway(client, gateway))
            direct.append(await one_call(client, upstream))
        else:
            direct.append(await one_call(client, upstream))
            via.append(await through_gateway(client, gateway))
    return direct, via


async def concurrent(
    clients: list[httpx.AsyncClient], upstream: str, gateway: Gateway, n: int, rounds: int
) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    direct: list[tuple[float, float]] = []
    via: list[tuple[float, float]] = []
    for r in range(rounds):
        for arm in ("direct", "gateway") if r % 2 == 0 else ("gateway", "direct"):
            if arm == "direct":
                calls = [one_call(clients[i % len(clients)], upstream) for i in range(n)]
                direct += await asyncio.gather(*calls)
            else:
                calls = [through_gateway(clients[i % len(clients)], gateway) for i in range(n)]
                via += await asyncio.gather(*calls)
    return direct, via


async def memory(client: httpx.AsyncClient, gateway: Gateway, calls: int) -> None:
    kept: list[Any] = []
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(calls):
        async with at.trajectory(f"m-{i}") as t:
            await one_call(client, gateway.url(t), LONG_BODY)
        kept.append(t)
    await asyncio.sleep(0.2)  # the gateway's thread lets go of the last request's objects
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    completion = sum(c.completion_tokens for t in kept for c in t.calls)
    prompt = sum(len(c.prompt_token_ids or ()) for t in kept for c in t.calls)
    per_token = (after - before) / completion
    verdict = "PASS" if per_token <= TARGET_BYTES else "MISS"
    print(f"\nmemory: {calls} captured {LONG}-token streamed calls, kept with their trajectories")
    print(
        f"  kept {after - before:,} B for {completion:,} completion tokens (+{prompt:,} prompt ids)"
    )
    print(f"  per completion token {per_token:.1f} B (target <= {TARGET_BYTES:g})  {verdict}")
    print(f"  per token, prompt ids counted too: {(after - before) / (completion + prompt):.1f} B")


async def main(args: argparse.Namespace) -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", UPSTREAM], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stdin is not None
    upstream = process.stdout.readline().strip()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=args.concurrency)
    clients = [httpx.AsyncClient(limits=limits, timeout=600) for _ in range(20)]
    try:
        async with Gateway(upstream) as gateway:
            assert gateway._server is not None
            tid = gateway._server._thread.native_id
            assert tid is not None
            print(f"upstream {upstream} (scripted, own process); {TOKENS}-token streams")
            print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
            await sequential(clients[0], upstream, gateway, 20)  # warm-up
            cpu0 = thread_cpu(tid)
            direct, via = await sequential(clients[0], upstream, gateway, args.calls)
            report("1 stream at a time", direct, via)
            cpu1 = thread_cpu(tid)
            print(f"  gateway CPU per call: {(cpu1 - cpu0) / args.calls * 1e3:.2f} ms")
            n = args.concurrency
            direct, via = await concurrent(clients, upstream, gateway, n, args.rounds)
            report(f"{n} streams at once", direct, via)
            cpu2 = thread_cpu(tid)
            print(f"  gateway CPU per call: {(cpu2 - cpu1) / (n * args.rounds) * 1e3:.2f} ms")
            await memory(clients[0], gateway, args.memory_calls)
    finally:
        for client in clients:
            await client.aclose()
        process.stdin.close()
        process.wait(timeout=30)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls, rougher figures")
    parser.add_argument("--concurrency", type=int, default=1000, help="streams at once")
    args = parser.parse_args()
    args.calls = 100 if args.quick else 400
    args.rounds = 1 if args.quick else 2
    args.memory_calls = 100 if args.quick else 400
    asyncio.run(main(args))
