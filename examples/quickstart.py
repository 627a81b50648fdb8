"""Quickstart: capture an OpenAI-SDK agent's runs and turn them into ART trajectories.

Runs offline against arttrace's scripted vLLM-like server:  python examples/quickstart.py
Point `base_url` at your vLLM / ART inference server to capture a real model instead.
"""

import asyncio

import art
from openai import AsyncOpenAI

import arttrace as at
from arttrace.testing import ScriptedLLM, serve

at.instrument()  # patch the OpenAI SDK once


async def main() -> None:
    with serve(ScriptedLLM()) as server:  # echoes the question back
        client = AsyncOpenAI(base_url=server.base_url, api_key="local")

        @at.trainable  # the LLM calls made in here are the policy's turns
        async def answer(question: str) -> str:
            response = await client.chat.completions.create(
                model="my-policy", messages=[{"role": "user", "content": question}]
            )
            return response.choices[0].message.content or ""

        runs = []
        for _ in range(4):  # four runs of one example
            async with at.trajectory(example_id="q-17") as t:
                reply = await answer("What is the capital of France?")
                t.reward = float("Paris" in reply)
            runs.append(t)

    group = art.TrajectoryGroup([t.to_art() for t in runs])
    print(f"{len(group.trajectories)} trajectories; first run:")
    for item in group.trajectories[0].messages_and_choices:
        print("  ", type(item).__name__, getattr(item, "message", item))


if __name__ == "__main__":
    asyncio.run(main())
