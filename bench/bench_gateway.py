"""What the gateway adds to a call: latency, CPU, and memory per captured token.

    python bench/bench_gateway.py                       # ~2-3 minutes on 2 idle cores
    python bench/bench_gateway.py --quick               # fewer calls, rougher figures
    python bench/bench_gateway.py --concurrency 1000    # the high-concurrency round's size
    python bench/bench_gateway.py --pace-ms 2           # the upstream sends a chunk every 2 ms
    python bench/bench_gateway.py --throughput          # only (d): `arttrace gateway --workers`

Three processes, as in use: the upstream (arttrace's scripted vLLM-like model, served as vLLM
serves, by uvicorn on loopback: one event loop, not a thread per connection, so 1,000 streams
measure the gateway rather than a thousand threads contending for one GIL), the caller (an
agent: an httpx client in a process of its own, this file run with ``--caller``), and this
one, which holds the ``arttrace.Gateway`` and the trajectories. Each call streams a 64-token
completion (one token per chunk, logprobs and token ids, as vLLM sends them). The caller calls
the upstream directly and through the gateway (each gateway call in a trajectory of its own),
alternating, so both arms share the machine's load. The caller times each call; this process
waits on a pipe meanwhile, so the gateway's thread is alone here.
Reported, each block with the load average beside it:

(a) time to first byte and to last byte, p50 and p99, direct and through the gateway, at 1
    stream and at ``--concurrency`` streams at once; the added latency is gateway - direct.
    At 1 stream a third arm, the floor, forwards with the gateway's parts and records nothing
    (:class:`Floor`): what an HTTP proxy built of them adds here, so the gateway's own share
    shows; a fourth, the pipe, copies the TCP bytes both ways (:class:`Pipe`): what the
    extra loopback hop alone adds, so the HTTP stack's share shows.
    The upstream streams as fast as it can by default, a core's worth of work beside the
    caller's and the gateway's on a 2-core machine; ``--pace-ms`` spaces its chunks as a
    real server's decoding does, on a clock (a chunk sent late does not push back the rest),
    so the last byte measures the proxy's delay, not how much the upstream's timer slipped.
    The fastest call of each arm (min) shows what a call costs when no neighbour delays it.
    Targets at 1 stream: p50 added <= 1 ms, p99 added <= 5 ms. Calls that fail are counted
    per arm, with their errors, and left out of the percentiles.
(b) the gateway's CPU per call (its thread's CPU time over the calls it served), the floor's
    beside it at 1 stream: the robust figure on a shared machine, where latencies move with
    the neighbours' load.
(c) memory kept per captured token by the finished trajectories (tracemalloc: the blocks
    allocated by arttrace's code; the process's whole growth is printed beside it, which also
    counts the connection pools' buffers and so depends on the rounds before), target <= 32 B.

(d) with ``--throughput`` (and nothing else): streamed tokens per second per core of
    ``arttrace gateway --workers N`` run as a process of its own (``--workers 1,2``), at 1,
    100 and 1,000 streams at once, paced (a chunk every 2 ms) and not: its runs are opened over
    HTTP and called at their URLs, and the tokens are divided by the CPU time of the gateway's
    processes; also the CPU per call, the wall tokens/s and, with 2 worker counts, their ratio.

It prints figures and PASS/MISS markers and exits 0; it is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from starlette.requests import Request

import arttrace as at
from arttrace.gateway import Gateway

try:  # the gateway's own server thread, on its event loop (uvloop's when installed)
    from arttrace.gateway._gateway import _ServerThread as ServerThread
except ImportError:  # arttrace before 0.2: asyncio's loop
    from arttrace._asgi_server import ServerThread

TOKENS, LONG = 64, 256
CONTENT = " ".join(f"w{i}" for i in range(TOKENS // 2))  # 32 words + 31 spaces + end token
LONG_CONTENT = " ".join(f"w{i}" for i in range(LONG // 2))
TARGET_P50_MS, TARGET_P99_MS, TARGET_BYTES = 1.0, 5.0, 32.0
UPSTREAM = f"""
import asyncio, json, sys
PACE = float(sys.argv[1])
from arttrace._asgi_server import ServerThread
from arttrace.testing import ScriptedLLM

long = lambda request: request["messages"][-1]["content"] == "long"
llm = ScriptedLLM(lambda request: {LONG_CONTENT!r} if long(request) else {CONTENT!r})

async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({{"type": "lifespan.startup.complete"}})
        await send({{"type": "lifespan.shutdown.complete"}})
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    status, payload, chunks = llm.respond(json.loads(body))
    llm.requests.clear()
    if chunks is None:
        data = json.dumps(payload).encode()
        headers = [(b"content-type", b"application/json")]
        await send({{"type": "http.response.start", "status": status, "headers": headers}})
        await send({{"type": "http.response.body", "body": data}})
        return
    headers = [(b"content-type", b"text/event-stream")]
    await send({{"type": "http.response.start", "status": 200, "headers": headers}})
    loop = asyncio.get_running_loop()
    start = loop.time()
    for i, chunk in enumerate(chunks, 1):
        await send({{"type": "http.response.body", "body": chunk, "more_body": True}})
        # One token at a time, streams interleaved, on the clock a server's decoding keeps: a
        # late chunk does not push back the ones after it (sleep(0) when unpaced).
        await asyncio.sleep(max(0.0, start + i * PACE - loop.time()))
    await send({{"type": "http.response.body", "body": b""}})

server = ServerThread(app, "127.0.0.1", 0, name="the scripted upstream")
server.start()
print("http://%s:%d/v1" % server.address, flush=True)
sys.stdin.read()
server.stop()
"""
BODY = {
    "model": "policy",
    "messages": [{"role": "user", "content": "Hi"}],
    "stream": True,
    "logprobs": True,
    "return_token_ids": True,
}
LONG_BODY = {**BODY, "messages": [{"role": "user", "content": "long"}]}
CLIENTS = 20
"""The caller's httpx clients per origin: a pool scans all its connections on each request, so
1,000 streams on one client would time that scan rather than the calls."""

Timing = tuple[float, float]
"""Seconds to the first body byte and to the last."""


class Floor:
    """Forwarding alone, with the gateway's parts (uvicorn with httptools, an aiohttp client)
    and nothing else: no run, no record. What it adds is what any Python proxy adds on this
    machine; the gateway's own cost is what it adds beyond that."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.session: aiohttp.ClientSession | None = None
        self.server = ServerThread(self, "127.0.0.1", 0, name="the floor proxy")

    @property
    def url(self) -> str:
        host, port = self.server.address
        return f"http://{host}:{port}/v1"

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                self.session = aiohttp.ClientSession(auto_decompress=False)
                await send({"type": "lifespan.startup.complete"})
            assert self.session is not None
            await self.session.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = await Request(scope, receive).body()
        assert self.session is not None
        path = scope["path"].removeprefix("/v1")
        headers = {"content-type": "application/json"}
        async with self.session.post(self.upstream + path, data=body, headers=headers) as answer:
            start = [(b"content-type", answer.content_type.encode())]
            await send({"type": "http.response.start", "status": answer.status, "headers": start})
            while piece := await answer.content.readany():
                await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


class Pipe:
    """A TCP pipe to the upstream, in a thread of its own: bytes copied both ways, no HTTP."""

    def __init__(self, upstream: str) -> None:
        self.upstream = httpx.URL(upstream)
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, name="the pipe", daemon=True).start()
        serving = asyncio.start_server(self.connected, "127.0.0.1", 0)
        server = asyncio.run_coroutine_threadsafe(serving, loop).result()
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"

    async def connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream = await asyncio.open_connection(self.upstream.host, self.upstream.port)
        await asyncio.gather(copy(reader, upstream[1]), copy(upstream[0], writer))


async def copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(2**16):
            writer.write(data)
    except OSError:
        pass
    finally:
        writer.close()


# -- the caller (its own process) -------------------------------------------------------------


async def one_call(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> Timing:
    started = time.perf_counter()
    first = None
    async with client.stream("POST", f"{url}/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"status {response.status_code}: {(await response.aread())[:200]!r}")
        async for _ in response.aiter_raw():
            if first is None:
                first = time.perf_counter()
    end = time.perf_counter()
    assert first is not None
    return first - started, end - started


async def timed(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> Timing | str:
    try:
        return await one_call(client, url, body)
    except Exception as error:  # counted and shown by the report, never hidden
        return f"{type(error).__name__}: {error}"[:200]


async def caller(concurrency: int) -> None:
    """Each line of stdin: ``{"urls": [...], "long": bool}``; one call to each URL, all at
    once; answers one line: a ``[first, last]`` or an error string per URL.

    Each origin has clients of its own, as an agent has a client per base URL: one httpx pool
    holding idle connections to two origins (the ports of two gateway workers) can close, when
    their keep-alive expiry passes while a burst of calls is assigned to them, a connection
    another call has just started on, and that call fails with ``ReadError`` (httpcore 1.0.9's
    pool, encode/httpcore#1110; ``test_gateway_workers.py``). That was the "0-11 calls of 1,000
    failed" with ``--workers 2``: the caller's own hang-up, not the gateway's."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=concurrency)
    clients: dict[str, list[httpx.AsyncClient]] = {}

    def client(i: int, url: str) -> httpx.AsyncClient:
        origin = str(httpx.URL(url).copy_with(path="/", query=None))
        if origin not in clients:
            clients[origin] = [
                httpx.AsyncClient(limits=limits, timeout=600) for _ in range(CLIENTS)
            ]
        return clients[origin][i % CLIENTS]

    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        order = json.loads(line)
        body = LONG_BODY if order["long"] else BODY
        calls = [timed(client(i, u), u, body) for i, u in enumerate(order["urls"])]
        print(json.dumps(await asyncio.gather(*calls)), flush=True)
    for pool in clients.values():
        for c in pool:
            await c.aclose()


# -- this process: the gateway and the trajectories -------------------------------------------


class Caller:
    """The caller process, driven over its stdin and stdout."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, concurrency: int) -> Caller:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--caller",
            "--concurrency",
            str(concurrency),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            limit=2**24,
        )
        return cls(process)

    async def calls(self, urls: list[str], *, long: bool = False) -> list[Timing | str]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"urls": urls, "long": long}).encode() + b"\n")
        await self.process.stdin.drain()
        answer = json.loads(await self.process.stdout.readline())
        return [(a[0], a[1]) if isinstance(a, list) else str(a) for a in answer]

    async def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        await self.process.wait()


async def through_gateway(caller: Caller, gateway: Gateway, n: int) -> list[Timing | str]:
    """``n`` calls at once through the gateway, each in a trajectory of its own."""
    urls: list[str] = []
    opened, done = asyncio.Event(), asyncio.Event()
    results: list[Timing | str] = []

    async def run() -> None:
        async with at.trajectory("bench") as t:
            position = len(urls)
            urls.append(gateway.url(t))
            if len(urls) == n:
                opened.set()
            await done.wait()  # the caller's answer has come: the call has ended
        if not isinstance(results[position], str) and t.trainable_turns != 1:
            results[position] = f"recorded {t.trainable_turns} trainable turns, not 1: {t.calls}"

    async def send() -> None:
        await opened.wait()
        results.extend(await caller.calls(urls))
        done.set()

    await asyncio.gather(send(), *(run() for _ in range(n)))
    return results


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def thread_cpu(native_id: int) -> float:
    """CPU seconds of one thread of this process (Linux)."""
    fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (5 min {five:.1f}) on {os.cpu_count()} CPUs"


def report(name: str, arms: dict[str, list[Timing | str]]) -> None:
    """``arms``: ``direct`` and ``gateway``, and maybe ``floor`` and ``pipe``."""
    print(f"\n{name}: {len(arms['direct'])} calls per arm, ms; {load()}")
    ok: dict[str, list[Timing]] = {}
    for arm, results in arms.items():
        ok[arm] = [r for r in results if not isinstance(r, str)]
        failed = Counter(r for r in results if isinstance(r, str))
        if failed:
            print(f"  {arm}: {sum(failed.values())} of {len(results)} calls FAILED (left out):")
            for why, count in failed.most_common(5):
                print(f"    {count} x {why}")
    if not all(ok.values()):
        print("  no figures: an arm has no successful call")
        return
    print(f"  {'':22}{'min':>10}{'p50':>10}{'p99':>10}")
    added = {}
    for k, label in ((0, "first byte"), (1, "last byte")):
        d = [x[k] * 1e3 for x in ok["direct"]]
        print(f"  {label + ', direct':22}{min(d):10.2f}{pct(d, 50):10.1f}{pct(d, 99):10.1f}")
        for arm in (a for a in ok if a != "direct"):
            g = [x[k] * 1e3 for x in ok[arm]]
            print(f"  {f'{label}, {arm}':22}{min(g):10.2f}{pct(g, 50):10.1f}{pct(g, 99):10.1f}")
            row = (min(g) - min(d), pct(g, 50) - pct(d, 50), pct(g, 99) - pct(d, 99))
            print(f"  {f'  added by {arm}':22}" + "".join(f"{x:10.2f}" for x in row))
            if arm == "gateway":
                added[label] = row[1:]
    if name.startswith("1 stream"):
        for label, (p50, p99) in added.items():
            verdict = "PASS" if p50 <= TARGET_P50_MS and p99 <= TARGET_P99_MS else "MISS"
            print(
                f"  added {label}: p50 {p50:.2f} ms (target <= {TARGET_P50_MS}), "
                f"p99 {p99:.2f} ms (target <= {TARGET_P99_MS})  {verdict}"
            )


async def sequential(
    caller: Caller, gateway: Gateway, urls: dict[str, str], calls: int
) -> dict[str, list[Timing | str]]:
    """``calls`` calls per arm, one at a time, the arms (``gateway`` and ``urls``: the direct
    one and the other proxies) taking turns in a rotating order, so all see the same drift."""
    arms: dict[str, list[Timing | str]] = {arm: [] for arm in ("direct", "gateway", *urls)}
    order = list(arms)
    for i in range(calls):
        turn = i % len(order)
        for arm in order[turn:] + order[:turn]:
            if arm == "gateway":
                arms[arm] += await through_gateway(caller, gateway, 1)
            else:
                arms[arm] += await caller.calls([urls[arm]])
    return arms


async def concurrent(
    caller: Caller, upstream: str, gateway: Gateway, n: int, rounds: int
) -> tuple[list[Timing | str], list[Timing | str]]:
    direct: list[Timing | str] = []
    via: list[Timing | str] = []
    for r in range(rounds):
        for arm in ("direct", "gateway") if r % 2 == 0 else ("gateway", "direct"):
            if arm == "direct":
                direct += await caller.calls([upstream] * n)
            else:
                via += await through_gateway(caller, gateway, n)
    return direct, via


def held_by_arttrace(snapshot: tracemalloc.Snapshot) -> int:
    """Bytes of the blocks allocated with arttrace's code on the stack (what it keeps, not the
    buffers of the connections the HTTP libraries pool, which depend on what ran before)."""
    mine = tracemalloc.Filter(True, f"{os.path.dirname(at.__file__)}{os.sep}*", all_frames=True)
    return sum(stat.size for stat in snapshot.filter_traces([mine]).statistics("filename"))


async def memory(caller: Caller, gateway: Gateway, calls: int) -> None:
    kept: list[Any] = []
    tracemalloc.start(64)  # deep enough to reach arttrace's frame below the event loop's
    for i in range(5):  # what the first calls allocate once (caches, pools) is not per token
        async with at.trajectory(f"warm-{i}") as t:
            await caller.calls([gateway.url(t)], long=True)
    await asyncio.sleep(0.2)
    gc.collect()
    before = tracemalloc.get_traced_memory()[0], held_by_arttrace(tracemalloc.take_snapshot())
    for i in range(calls):
        async with at.trajectory(f"m-{i}") as t:
            (result,) = await caller.calls([gateway.url(t)], long=True)
        assert not isinstance(result, str), result
        kept.append(t)
    await asyncio.sleep(0.2)  # the gateway's thread lets go of the last request's objects
    gc.collect()
    after = tracemalloc.get_traced_memory()[0], held_by_arttrace(tracemalloc.take_snapshot())
    tracemalloc.stop()
    completion = sum(c.completion_tokens for t in kept for c in t.calls)
    prompt = sum(len(c.prompt_token_ids or ()) for t in kept for c in t.calls)
    held = after[1] - before[1]
    per_token = held / completion
    verdict = "PASS" if per_token <= TARGET_BYTES else "MISS"
    print(f"\nmemory: {calls} captured {LONG}-token streamed calls, kept with their trajectories")
    tokens = f"{completion:,} completion tokens (+{prompt:,} prompt ids)"
    print(f"  arttrace keeps {held:,} B for {tokens}")
    print(f"  per completion token {per_token:.1f} B (target <= {TARGET_BYTES:g})  {verdict}")
    print(f"  per token, prompt ids counted too: {held / (completion + prompt):.1f} B")
    print(
        f"  the process as a whole grew {after[0] - before[0]:,} B "
        f"({(after[0] - before[0]) / completion:.1f} B per completion token, with the pools)"
    )


# -- (d) throughput: `arttrace gateway --workers N` as a process of its own --------------------


def start_upstream(pace_ms: float) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-c", UPSTREAM, str(pace_ms / 1e3)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    return process, process.stdout.readline().strip()


def process_cpu(pids: list[int]) -> float:
    """CPU seconds of these processes, all their threads (Linux's schedstat: nanoseconds,
    where /proc/PID/stat counts 10 ms ticks)."""
    total = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def gateway_pids(process: subprocess.Popen[str]) -> list[int]:
    children = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
    return [process.pid, *map(int, children)]


async def open_runs(base: str, n: int) -> list[str]:
    """``n`` runs opened over HTTP, each on a connection of its own (so that with workers
    they spread as agents' runs would); their OpenAI base URLs."""
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:
        urls: list[str] = []
        for start in range(0, n, 100):
            answers = await asyncio.gather(
                *(
                    client.post(f"{base}/runs", json={"example_id": f"q-{i}"})
                    for i in range(start, min(n, start + 100))
                )
            )
            urls += [a.json()["url"] for a in answers]
    return urls


async def throughput(args: argparse.Namespace) -> None:
    """Streamed tokens per second per core of the gateway process(es), at 1, 100 and 1,000
    streams at once, paced and unpaced, with 1 and 2 workers: the gateway runs as
    ``arttrace gateway --workers N`` (its runs opened over HTTP, its calls straight to each
    run's URL), and its processes' CPU time over the calls is what the tokens are divided by."""
    import tempfile

    upstreams = {2.0: start_upstream(2.0), 0.0: start_upstream(0.0)}
    caller = await Caller.start(1000)
    sizes = (1, 100) if args.quick else (1, 100, 1000)
    print(f"\n(d) throughput of `arttrace gateway --workers N`; {load()}")
    print(
        f"  {'workers':>7} {'pace':>6} {'streams':>7} {'calls':>6} {'failed':>6} "
        f"{'CPU/call':>9} {'tok/s/core':>11} {'tok/s wall':>11} {'1st byte p50':>13}  load"
    )
    wall: dict[tuple[int, float, int], float] = {}
    try:
        for workers in args.workers:
            for pace, (_, upstream) in upstreams.items():
                with tempfile.TemporaryDirectory() as out:
                    command = ["gateway", "--upstream", upstream, "--port", "0", "--out", out]
                    if workers > 1:  # (a gateway before 0.2 has no --workers)
                        command += ["--workers", f"{workers}"]
                    gateway = subprocess.Popen(
                        [sys.executable, "-m", "arttrace.app.cli", *command],
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                    try:
                        assert gateway.stdout is not None
                        line = gateway.stdout.readline()
                        base = line.split("listening on ")[1].split(" ")[0]
                        pids = gateway_pids(gateway)
                        await caller.calls((await open_runs(base, 20))[:20])  # warm-up
                        for n in sizes:
                            rounds = (20 if args.quick else 40) if n == 1 else (1 if n > 100 else 3)
                            urls = await open_runs(base, n * rounds)
                            cpu0, t0 = process_cpu(pids), time.perf_counter()
                            results: list[Timing | str] = []
                            for r in range(rounds):
                                results += await caller.calls(urls[r * n : (r + 1) * n])
                            cpu1, t1 = process_cpu(pids), time.perf_counter()
                            ok = [x for x in results if not isinstance(x, str)]
                            tokens = TOKENS * len(ok)
                            wall[workers, pace, n] = tokens / (t1 - t0)
                            first = pct([x[0] * 1e3 for x in ok], 50) if ok else float("nan")
                            print(
                                f"  {workers:>7} {f'{pace:g} ms' if pace else 'none':>6} "
                                f"{n:>7} {len(results):>6} {len(results) - len(ok):>6} "
                                f"{(cpu1 - cpu0) / max(1, len(ok)) * 1e3:>6.2f} ms "
                                f"{tokens / max(cpu1 - cpu0, 1e-9):>11,.0f} "
                                f"{tokens / (t1 - t0):>11,.0f} {first:>10.2f} ms  "
                                f"{os.getloadavg()[0]:.1f}",
                                flush=True,
                            )
                            failed = Counter(x for x in results if isinstance(x, str))
                            for why, count in failed.most_common(3):
                                print(f"      {count} x {why}")
                    finally:
                        gateway.terminate()
                        gateway.wait(timeout=60)
        for pace in upstreams if len(args.workers) > 1 else ():
            n = max(sizes)
            ratio = wall[2, pace, n] / wall[1, pace, n]
            print(
                f"  2 workers / 1, wall tokens/s at {n} streams, "
                f"{f'a chunk every {pace:g} ms' if pace else 'unpaced'}: {ratio:.2f}x"
            )
    finally:
        await caller.stop()
        for process, _ in upstreams.values():
            assert process.stdin is not None
            process.stdin.close()
            process.wait(timeout=30)


async def main(args: argparse.Namespace) -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", UPSTREAM, str(args.pace_ms / 1e3)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdin is not None
    upstream = process.stdout.readline().strip()
    caller = await Caller.start(args.concurrency)
    floor = Floor(upstream)
    floor.server.start()
    urls = {"direct": upstream, "floor": floor.url, "pipe": Pipe(upstream).url}
    try:
        async with Gateway(upstream) as gateway:
            assert gateway._server is not None
            tid, floor_tid = gateway._server._thread.native_id, floor.server._thread.native_id
            assert tid is not None and floor_tid is not None
            pace = f"a chunk every {args.pace_ms:g} ms" if args.pace_ms else "as fast as it can"
            print(f"upstream {upstream} (scripted, own process); {TOKENS}-token streams, {pace}")
            print(f"at start: {load()}")
            await sequential(caller, gateway, urls, 20)  # warm-up
            cpu0, floor0 = thread_cpu(tid), thread_cpu(floor_tid)
            arms = await sequential(caller, gateway, urls, args.calls)
            cpu1, floor1 = thread_cpu(tid), thread_cpu(floor_tid)
            report("1 stream at a time", arms)
            print(
                f"  gateway CPU per call: {(cpu1 - cpu0) / args.calls * 1e3:.2f} ms "
                f"(floor {(floor1 - floor0) / args.calls * 1e3:.2f} ms)"
            )
            n = args.concurrency
            direct, via = await concurrent(caller, upstream, gateway, n, args.rounds)
            cpu2 = thread_cpu(tid)
            report(f"{n} streams at once", {"direct": direct, "gateway": via})
            print(f"  gateway CPU per call: {(cpu2 - cpu1) / (n * args.rounds) * 1e3:.2f} ms")
            await memory(caller, gateway, args.memory_calls)
    finally:
        await caller.stop()
        floor.server.stop()
        process.stdin.close()
        process.wait(timeout=30)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls, rougher figures")
    parser.add_argument("--concurrency", type=int, default=1000, help="streams at once")
    parser.add_argument(
        "--pace-ms", type=float, default=0.0, help="the upstream's time between chunks (0: none)"
    )
    parser.add_argument(
        "--throughput",
        action="store_true",
        help="only (d): tokens/s per core of `arttrace gateway --workers 1` and `2`",
    )
    parser.add_argument(
        "--workers",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[1, 2],
        help="(d)'s worker counts, comma-separated",
    )
    parser.add_argument("--caller", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.caller:
        asyncio.run(caller(args.concurrency))
        sys.exit(0)
    if args.throughput:
        asyncio.run(throughput(args))
        sys.exit(0)
    args.calls = 100 if args.quick else 400
    args.rounds = 2  # in both orders: the first arm of a round opens the connections
    args.memory_calls = 100 if args.quick else 400
    asyncio.run(main(args))
