"""The agents of tests/executors/test_rollout_timeout.py, in a light module of their own: a Ray
worker imports it to load a rollout (the test module would bring pytest, ART and the fixtures).

Each run asks its question of a scripted server (``example["answers"]``), which answers; an
odd-numbered run then asks a server that never answers (``example["held"]``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import openai

import arttrace as at


def _slot() -> int:
    return int(at.current_trajectory().metadata["rollout"] or 0)


@at.trainable
async def _ask(client: openai.AsyncOpenAI, question: str) -> str:
    reply = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": question}]
    )
    return reply.choices[0].message.content or ""


async def held_async(example: dict[str, Any]) -> float:
    """One answered call, then (odd runs) one that is never answered."""
    slot = _slot()
    async with openai.AsyncOpenAI(
        base_url=example["answers"], api_key="k", max_retries=0
    ) as client:
        await _ask(client, example["q"])
    if slot % 2:
        async with openai.AsyncOpenAI(base_url=example["held"], api_key="k", max_retries=0) as held:
            await _ask(held, "and now?")
    return slot / 2


@at.trainable
def _ask_sync(client: openai.OpenAI, question: str) -> str:
    reply = client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": question}]
    )
    return reply.choices[0].message.content or ""


def held_sync(example: dict[str, Any]) -> float:
    """:func:`held_async`, as a sync rollout (run in a worker thread)."""
    slot = _slot()
    with openai.OpenAI(base_url=example["answers"], api_key="k", max_retries=0) as client:
        _ask_sync(client, example["q"])
    if slot % 2:
        with openai.OpenAI(base_url=example["held"], api_key="k", max_retries=0) as held:
            _ask_sync(held, "and now?")
    return slot / 2


async def blocks_its_loop(example: dict[str, Any]) -> float:
    """One answered call, then (odd runs) a sync sleep in the async rollout: nothing can
    stop it on its event loop."""
    slot = _slot()
    async with openai.AsyncOpenAI(
        base_url=example["answers"], api_key="k", max_retries=0
    ) as client:
        await _ask(client, example["q"])
    if slot % 2:
        time.sleep(example["block"])  # the mistake this agent makes on purpose
    await asyncio.sleep(0)
    return slot / 2
