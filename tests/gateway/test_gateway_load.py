"""1,000 runs streaming through one gateway at once: every call lands in its own run, whole."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

import arttrace as at
from arttrace.gateway import Gateway
from arttrace.testing import SimpleChatTokenizer

RUNS = 1000
# The upstream runs in a process of its own (the scripted server, one thread per connection):
# it answers each question "run <i>" with "<i>", so that a crossed answer shows.
UPSTREAM = """
import sys
from arttrace.testing import ScriptedLLM, serve
server = serve(ScriptedLLM(lambda request: request["messages"][-1]["content"].split()[-1]))
print(server.base_url, flush=True)
sys.stdin.read()
"""


@pytest.fixture
def upstream() -> Iterator[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", UPSTREAM], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stdin is not None
    yield process.stdout.readline().strip()
    process.stdin.close()
    process.wait(timeout=30)


async def test_a_thousand_concurrent_streamed_runs_cross_and_lose_nothing(upstream: str) -> None:
    # Callers on 20 clients: an httpx pool scans all its connections on each request, so one
    # client with 1,000 streams would spend its time there.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=RUNS)
    clients = [httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(300.0)) for _ in range(20)]
    async with Gateway(upstream) as gateway:
        started = asyncio.Event()
        waiting = 0

        async def run(i: int) -> tuple[at.Trajectory, str]:
            nonlocal waiting
            async with at.trajectory(f"q-{i}") as t:
                url = gateway.url(t)
                waiting += 1
                if waiting == RUNS:
                    started.set()
                await started.wait()  # every run open before any call: all at once
                body = {
                    "model": "policy",
                    "messages": [{"role": "user", "content": f"run {i}"}],
                    "stream": True,
                }
                text = ""
                client = clients[i % len(clients)]
                async with client.stream("POST", f"{url}/chat/completions", json=body) as r:
                    assert r.status_code == 200, await r.aread()
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            for choice in json.loads(line[6:])["choices"]:
                                text += choice["delta"].get("content") or ""
            return t, text

        results = await asyncio.gather(*(run(i) for i in range(RUNS)))
    for client in clients:
        await client.aclose()

    tokenizer = SimpleChatTokenizer()
    for i, (t, text) in enumerate(results):
        assert text == str(i)  # the caller got its own answer
        (call,) = t.calls  # its run holds its one call, and only that
        assert call.messages == [{"role": "user", "content": f"run {i}"}]
        choice = call.choices[0]
        assert choice.message["content"] == text
        assert call.trainable and call.untrainable_reason(choice) is None
        expected = tokenizer.completion(call.messages, None, choice.message).token_ids
        assert choice.token_ids is not None and choice.token_ids.tolist() == expected
        assert call.prompt_token_ids is not None
        assert call.prompt_token_ids.tolist() == tokenizer.prompt(call.messages, None)
