"""What converting a step's runs to ART costs: arttrace's conversion against validating.

512 runs of bench_trainer's agent (two policy turns, ~130 sampled tokens per run) are captured
once through the in-process ScriptedLLM transport. Then, in alternating order each round:

- ``direct``: ``Trajectory.to_art()`` as shipped (each token's logprob object built directly);
- ``validated``: the same, with each trainable turn's Choice made by ``Choice.model_validate``
  of plain dicts, as before (the reference ``tests/capture/test_art_convert.py`` holds it equal to).

Per arm: CPU time of this thread (``thread_time``: steadier than wall time on a busy machine)
for converting all 512 runs with the collector off (as the Trainer does), for one full
collection over the result, and for freeing it. Ratios are medians of per-round ratios.

    python bench/bench_convert.py [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import httpx
import openai
from openai.types.chat.chat_completion import Choice

import arttrace as at
import arttrace.capture._art as conversion
from arttrace.capture._conversations import Turn
from arttrace.testing import ScriptedLLM
from bench_trainer import GROUP_SIZE, GROUPS, make_rollout, responder


def validated(turn: Turn) -> Choice:
    record, prompt = turn.choice, turn.call.prompt_token_ids
    assert record.logprobs is not None and record.token_ids is not None and prompt is not None
    tokens = record.tokens or [f"token_id:{i}" for i in record.token_ids]
    top = record.top_logprobs or [[] for _ in tokens]
    content = [
        {"token": token, "logprob": logprob, "bytes": None, "top_logprobs": alternatives}
        for token, logprob, alternatives in zip(tokens, record.logprobs, top, strict=True)
    ]
    return Choice.model_validate(
        {
            "index": record.index,
            "finish_reason": record.finish_reason,
            "message": record.message,
            "logprobs": {"content": content, "refusal": None},
            "prompt_token_ids": prompt.tolist(),
            "token_ids": record.token_ids.tolist(),
        }
    )


async def capture() -> list[at.Trajectory]:
    at.instrument()
    http = httpx.AsyncClient(transport=ScriptedLLM(responder).transport())
    client = openai.AsyncOpenAI(base_url="http://llm/v1", api_key="x", http_client=http)
    rollout = make_rollout(client)
    runs = []
    for i in range(GROUPS * GROUP_SIZE):
        example = {"id": f"ex-{i % GROUPS}", "q": f"question {i % GROUPS}"}
        async with at.trajectory(example["id"]) as t:
            t.reward = await rollout(example)
        runs.append(t)
    await client.close()
    return runs


def timed(convert: Callable[[], list[Any]]) -> tuple[float, float, float]:
    started = time.thread_time()
    out = convert()
    converted = time.thread_time()
    gc.collect()
    collected = time.thread_time()
    del out
    return converted - started, collected - converted, time.thread_time() - collected


def main(rounds: int) -> None:
    runs = asyncio.run(capture())
    tokens = sum(conversion.trainable_tokens(t.to_art()) for t in runs)
    shipped = conversion._choice
    arms = {"direct": shipped, "validated": validated}
    results: dict[str, list[tuple[float, float, float]]] = {arm: [] for arm in arms}
    gc.collect()
    gc.freeze()  # what import art brought: as bench_trainer does
    gc.disable()
    try:
        for r in range(rounds):
            for arm in list(arms) if r % 2 else list(arms)[::-1]:
                conversion._choice = arms[arm]
                results[arm].append(timed(lambda: [t.to_art() for t in runs]))
    finally:
        conversion._choice = shipped
        gc.enable()
    print(
        f"{len(runs)} runs, {tokens} trainable tokens; {rounds} rounds;"
        f" load average {os.getloadavg()[0]:.2f}; thread CPU ms, median [min]"
    )
    phases = ("to_art, collector off", "one full collection", "freeing")
    for n, phase in enumerate(phases):
        line = f"  {phase:22s}"
        for arm in arms:
            values = [row[n] for row in results[arm]]
            line += f"  {arm} {1000 * statistics.median(values):7.1f} [{1000 * min(values):6.1f}]"
        ratios = [d[n] / v[n] for d, v in zip(results["direct"], results["validated"], strict=True)]
        line += f"   direct/validated {statistics.median(ratios):.2f}"
        line += f" [{min(ratios):.2f} .. {max(ratios):.2f}]"
        print(line)
    per_token = statistics.median(
        (v[0] - d[0]) / tokens for d, v in zip(results["direct"], results["validated"], strict=True)
    )
    print(f"  saved per sampled token (to_art): {1e6 * per_token:.2f} µs")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=12)
    main(parser.parse_args().rounds)
