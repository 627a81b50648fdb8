"""What translation adds to a call: an agent speaking the Responses API or Anthropic Messages
through the gateway's translation, against the same agent's call in Chat Completions through
the plain gateway (same upstream, same sampled tokens).

    python bench/bench_translation.py            # ~1-2 minutes on 2 idle cores
    python bench/bench_translation.py --quick    # fewer calls, rougher figures
    python bench/bench_translation.py --pace-ms 2

Three processes, as in use: the upstream (arttrace's scripted vLLM-like model served by
uvicorn, a 64-token answer, one token per chunk, with logprobs and token ids; ``--tool``: the
answer is a function call, the turn stock vLLM's Responses API cannot train), the caller (an
httpx client in a process of its own: this file with ``--caller``), and this one, which holds
the ``arttrace.Gateway`` (translating ``responses`` and ``messages``) and a trajectory per
call. The arms take turns, one call at a time, in a rotating order:

- ``chat``: ``POST /chat/completions`` through the gateway, recorded, not translated (the
  baseline: the plain gateway);
- ``responses``: ``POST /responses``, translated (the upstream is called at
  ``/chat/completions``; the caller gets the ``response.*`` events);
- ``messages``: ``POST /messages``, translated (Anthropic's events).

Reported: time to first byte and last byte, p50 and p99, streamed and whole, per arm, and
each translated arm's added latency over ``chat``; then the gateway process's CPU per call
(``time.process_time`` over a block of calls of one arm; the caller and the upstream are other
processes), and its ratio to ``chat``'s; last, the translators alone (a stream's chunks parsed
and translated, no I/O). Every call must be one trainable turn in its run: a
call that is not is counted as failed. It prints figures and exits 0; a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import httpx

import arttrace as at

TOKENS = 64
CONTENT = " ".join(f"w{i}" for i in range(TOKENS // 2))
UPSTREAM = """
import asyncio, json, sys
PACE, TOOL = float(sys.argv[1]), sys.argv[2] == "tool"
from arttrace._asgi_server import ServerThread
from arttrace.testing import Reply, ScriptedLLM, ToolCall

CALL = Reply(tool_calls=[ToolCall("lookup", {"query": " ".join(f"w{i}" for i in range(20))})])
llm = ScriptedLLM(lambda request: CALL if TOOL else CONTENT)

async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
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
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})
        return
    headers = [(b"content-type", b"text/event-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    loop = asyncio.get_running_loop()
    start = loop.time()
    for i, chunk in enumerate(chunks, 1):
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await asyncio.sleep(max(0.0, start + i * PACE - loop.time()))
    await send({"type": "http.response.body", "body": b""})

server = ServerThread(app, "127.0.0.1", 0, name="the scripted upstream")
server.start()
print("http://%s:%d/v1" % server.address, flush=True)
sys.stdin.read()
server.stop()
""".replace("CONTENT)", repr(CONTENT) + ")")
TOOLS_R = [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}]
TOOLS_C = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
TOOLS_M = [{"name": "lookup", "input_schema": {"type": "object"}}]
ARMS = ("chat", "responses", "messages")


def request(arm: str, stream: bool) -> tuple[str, dict[str, Any]]:
    """The path and body of one call of ``arm``."""
    if arm == "chat":
        body = {
            "model": "policy",
            "messages": [{"role": "user", "content": "Hi"}],
            "tools": TOOLS_C,
        }
        return "chat/completions", {**body, "stream": stream}
    if arm == "responses":
        return "responses", {"model": "policy", "input": "Hi", "tools": TOOLS_R, "stream": stream}
    body = {"model": "policy", "max_tokens": 256, "messages": [{"role": "user", "content": "Hi"}]}
    return "messages", {**body, "tools": TOOLS_M, "stream": stream}


# -- the caller (its own process) -------------------------------------------------------------


def caller() -> None:
    """Each line of stdin: ``{"url", "arm", "stream"}``; answers ``[first, last]`` seconds or
    an error string."""
    with httpx.Client(timeout=120) as client:
        for line in sys.stdin:
            order = json.loads(line)
            path, body = request(order["arm"], order["stream"])
            started = time.perf_counter()
            first = None
            try:
                with client.stream("POST", f"{order['url']}/{path}", json=body) as response:
                    for _ in response.iter_raw():
                        if first is None:
                            first = time.perf_counter()
                    if response.status_code != 200:
                        raise RuntimeError(f"status {response.status_code}")
                end = time.perf_counter()
                assert first is not None
                answer: Any = [first - started, end - started]
            except Exception as error:
                answer = f"{type(error).__name__}: {error}"[:200]
            print(json.dumps(answer), flush=True)


# -- this process: the gateway, the trajectories ----------------------------------------------


class Bench:
    def __init__(self, upstream: str) -> None:
        self.gateway = at.Gateway(upstream, translate="responses,messages").start()
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--caller"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def call(self, arm: str, stream: bool) -> tuple[float, float] | str:
        """One call of ``arm`` in a run of its own, which must record one trainable turn."""
        assert self.process.stdin is not None and self.process.stdout is not None
        with at.trajectory("bench") as t:
            url = self.gateway.url(t)
            self.process.stdin.write(json.dumps({"url": url, "arm": arm, "stream": stream}) + "\n")
            self.process.stdin.flush()
            answer = json.loads(self.process.stdout.readline())
        if isinstance(answer, str):
            return answer
        if t.trainable_turns != 1:
            return f"recorded {t.trainable_turns} trainable turns, not 1"
        return answer[0], answer[1]

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait()
        self.gateway.stop()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (5 min {five:.1f}) on {os.cpu_count()} CPUs"


def latency(bench: Bench, calls: int, stream: bool) -> None:
    results: dict[str, list[Any]] = {arm: [] for arm in ARMS}
    for i in range(calls):
        turn = i % len(ARMS)
        for arm in ARMS[turn:] + ARMS[:turn]:
            results[arm].append(bench.call(arm, stream))
    kind = "streamed" if stream else "whole"
    print(f"\n{kind}: {calls} calls per arm, ms; {load()}")
    ok = {arm: [r for r in rs if not isinstance(r, str)] for arm, rs in results.items()}
    for arm, rs in results.items():
        failed = Counter(r for r in rs if isinstance(r, str))
        for why, count in failed.most_common(3):
            print(f"  {arm}: {count} FAILED: {why}")
    if not all(ok.values()):
        return
    print(f"  {'':30}{'p50':>9}{'p99':>9}   added over chat: p50, p99")
    for k, label in ((0, "first byte"), (1, "last byte")):
        base = [x[k] * 1e3 for x in ok["chat"]]
        for arm in ARMS:
            v = [x[k] * 1e3 for x in ok[arm]]
            row = f"  {f'{label}, {arm}':30}{pct(v, 50):9.2f}{pct(v, 99):9.2f}"
            if arm != "chat":
                row += f"   {pct(v, 50) - pct(base, 50):+8.2f}{pct(v, 99) - pct(base, 99):+8.2f}"
            print(row)


def cpu(bench: Bench, calls: int) -> None:
    print(f"\ngateway process CPU per call (time.process_time), ms; {load()}")
    per: dict[str, float] = {}
    for stream in (True, False):
        for arm in ARMS:
            bench.call(arm, stream)  # warm
            started = time.process_time()
            for _ in range(calls):
                bench.call(arm, stream)
            per[arm] = (time.process_time() - started) / calls * 1e3
        kind = "streamed" if stream else "whole"
        print(
            f"  {kind:9}"
            + "".join(
                f"  {arm} {per[arm]:.2f}"
                + ("" if arm == "chat" else f" ({per[arm] / per['chat']:.2f}x)")
                for arm in ARMS
            )
        )


def translators(rounds: int) -> None:
    """The translators alone: a 64-token stream's chunks (as the scripted vLLM sends them,
    logprobs and token ids included) parsed and translated, CPU time."""
    import orjson

    from arttrace.testing import ScriptedLLM
    from arttrace.translation import Chains, ResponsesTranslation
    from arttrace.translation._messages import MessagesTranslation

    llm = ScriptedLLM(lambda request: CONTENT)
    body = {
        "model": "policy",
        "messages": [{"role": "user", "content": "Hi"}],
        **{"stream": True, "stream_options": {"include_usage": True}},
        **{"logprobs": True, "return_token_ids": True},
    }
    _, _, chunks = llm.respond(body)
    assert chunks is not None
    datas = [c.removeprefix(b"data: ").strip() for c in chunks]
    datas = [d for d in datas if d and d != b"[DONE]"]
    made = {
        "responses": lambda: ResponsesTranslation(
            {"model": "policy", "input": "Hi", "stream": True}, Chains(8)
        ),
        "messages": lambda: MessagesTranslation(
            {"model": "policy", "max_tokens": 256, "messages": body["messages"], "stream": True}
        ),
    }
    print(f"\nthe translators alone, a {len(datas)}-chunk stream, CPU; {load()}")
    for api, make in made.items():
        started = time.process_time()
        for _ in range(rounds):
            t = make()
            out = t.start()
            for data in datas:
                out += t.chunk(orjson.loads(data))
            out += t.end()
        per_call = (time.process_time() - started) / rounds
        per_chunk = per_call / len(datas) * 1e6
        print(f"  {api:10} {per_call * 1e3:.3f} ms per stream, {per_chunk:.1f} µs per chunk")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--caller", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tool", action="store_true", help="the answer is a function call")
    parser.add_argument("--pace-ms", type=float, default=0.0)
    args = parser.parse_args()
    if args.caller:
        caller()
        return
    upstream = subprocess.Popen(
        [sys.executable, "-c", UPSTREAM, str(args.pace_ms / 1e3), "tool" if args.tool else "text"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert upstream.stdout is not None and upstream.stdin is not None
    url = upstream.stdout.readline().strip()
    bench = Bench(url)
    try:
        calls = 60 if args.quick else 300
        answer = "a function call" if args.tool else f"{TOKENS} tokens of text"
        print(f"upstream: {answer}, pace {args.pace_ms} ms per chunk")
        for _ in range(5):
            for arm in ARMS:
                bench.call(arm, True)  # warm the pools and the imports
        latency(bench, calls, stream=True)
        latency(bench, calls // 2, stream=False)
        cpu(bench, calls // 3)
        translators(200 if args.quick else 1000)
    finally:
        bench.stop()
        upstream.stdin.close()
        upstream.wait()


if __name__ == "__main__":
    main()
