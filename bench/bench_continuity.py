"""What the token-continuity check costs per run, and where it runs.

A typical agent run is captured once through the in-process ScriptedLLM transport (real
``openai`` client, ``arttrace.instrument()``): four policy turns (three tool calls, then the
answer) under a ~400-token system prompt, ~1,500 prompt tokens by the last turn. A second
run has a break at every boundary (the agent re-sends each assistant turn with a space added,
a ``template`` break to the check), for the classification path. A third puts the time in its
system prompt at every call: each call extends no conversation, and the check finds the
conversation it carries on (an ``other`` break, the edit named ``system``). Then, in
alternating order each round, CPU time of this thread (``thread_time``) for:

- ``assemble``: ``Trajectory.conversations()``, the calls grouped into conversations (the
  search for a conversation carried on after an edit included);
- ``check``: ``arttrace.capture._continuity.continuity(conversations)``, the check alone (what
  ``to_art()`` adds, on the conversations it assembles anyway);
- ``to_art``: ``Trajectory.to_art()`` whole (check included), for scale.

It also shows that the check is not on the capture path: ``arttrace.capture._continuity`` is not
imported while the runs are captured (it loads on the first ``to_art()``, or with the
Trainer), so the capture overhead figures of ``bench_capture.py`` do not move.

    python bench/bench_continuity.py [--rounds N] [--repeat N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import httpx
import openai

import arttrace as at
from arttrace.testing import Reply, ScriptedLLM, ToolCall

SYSTEM = "You are a careful research assistant. " * 60
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a fact up.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
]


def responder(request: dict[str, Any]) -> Reply:
    calls = sum(1 for m in request["messages"] if m["role"] == "tool")
    if calls < 3:
        return Reply(
            "Let me look that up first. " * 3,
            tool_calls=[ToolCall("lookup", {"q": f"fact {calls}"})],
        )
    return Reply("The answer is 42, because " + "the facts agree on it. " * 12)


async def capture(kind: str) -> at.Trajectory:
    http = httpx.AsyncClient(transport=ScriptedLLM(responder).transport())
    client = openai.AsyncOpenAI(base_url="http://llm/v1", api_key="x", http_client=http)

    @at.trainable
    async def agent(question: str) -> None:
        messages: list[Any] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": question},
        ]
        for turn in range(4):
            if kind == "timestamped":  # the agent's system prompt tells the time
                messages[0] = {"role": "system", "content": f"{SYSTEM}It is 12:{turn:02d}."}
            reply = await client.chat.completions.create(
                model="policy", messages=messages, tools=TOOLS
            )
            message = reply.choices[0].message
            if not message.tool_calls:
                return
            sent = message.model_dump(exclude_none=True)
            if kind == "broken":  # the agent re-sends the turn with a space added
                sent["content"] += " "
            messages.append(sent)
            result = "A fact worth knowing, found in the archive. " * 8
            messages.append(
                {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": result}
            )

    async with at.trajectory("bench") as t:
        await agent("What is the answer?")
        t.reward = 1.0
    await client.close()
    return t


def cpu_us(fn: Callable[[], Any], repeat: int) -> float:
    started = time.thread_time()
    for _ in range(repeat):
        fn()
    return (time.thread_time() - started) / repeat * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()

    at.instrument()
    runs = {name: asyncio.run(capture(name)) for name in ("typical", "broken", "timestamped")}
    on_capture_path = "arttrace.capture._continuity" in sys.modules
    at.uninstrument()
    from arttrace.capture._continuity import continuity  # after capturing, on purpose

    results: dict[str, dict[str, list[float]]] = {name: {} for name in runs}
    for _ in range(args.rounds):
        for name, t in runs.items():
            conversations = t.conversations()
            arms = {
                "assemble": t.conversations,
                "check": lambda c=conversations: continuity(c),
                "to_art": t.to_art,
            }
            for arm, fn in arms.items():
                results[name].setdefault(arm, []).append(cpu_us(fn, args.repeat))

    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    print(f"arttrace.capture._continuity imported while capturing: {on_capture_path}")
    for name, t in runs.items():
        found = continuity(t.conversations())
        prompt = t.calls[-1].prompt_token_ids
        print(
            f"\n{name}: {len(t.calls)} turns, {len(prompt or ())} prompt tokens in the last, "
            f"{found.boundaries} boundaries, {len(found.breaks)} breaks "
            f"({dict(found.counts())}; edits { ({k: v for k, v in found.edits().items() if v}) }), "
            f"{found.sequences} ART "
            f"sequences for {found.conversations} conversation(s)"
        )
        check, whole = results[name]["check"], results[name]["to_art"]
        grouping = results[name]["assemble"]
        print(f"  assemble median {statistics.median(grouping):7.1f} us CPU per run")
        ratios = [c / w for c, w in zip(check, whole, strict=True)]
        print(
            f"  check   median {statistics.median(check):8.1f} us CPU per run "
            f"(min {min(check):.1f})\n"
            f"  to_art  median {statistics.median(whole):8.1f} us CPU per run "
            f"(min {min(whole):.1f})\n"
            f"  check / to_art  median {statistics.median(ratios):.1%}"
        )


if __name__ == "__main__":
    main()
