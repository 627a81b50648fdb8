"""Your own agent, trained with GRPO on this machine's CPU: no GPU, no model server, no download.

    python examples/my_agent_cpu.py [STEPS]    (the cpu extra: pip install 'arttrace[cpu]')

The agent is plain OpenAI SDK code. `CPUBackend` serves a tiny Qwen2 (random weights) on
127.0.0.1 as vLLM would, and trains it with ART's own loss; the `Trainer` runs the GRPO steps:
four runs of the agent per example, the runs of one example grouped, each group whose rewards
differ shipped to the backend. Swap in your agent, your examples and your reward; with a GPU,
swap `CPUBackend()` for `art.local.LocalBackend()` and a real base model.

A random model writes random tokens from its 151k-token vocabulary, so the reward here is a
stand-in anyone can compute: the share of the reply written in plain letters. Every group's
runs score differently, so every step ships. Run it again to continue from the last step
(the journal and the checkpoint are in runs/my_agent_cpu/); delete that folder to start over.
"""

import asyncio
import sys

import art
from openai import AsyncOpenAI

import arttrace as at

at.instrument()  # patches the OpenAI SDK: the agent's calls are captured with their tokens

EXAMPLES = [
    {"id": "refund", "message": "I want my money back for order 1042."},
    {"id": "late", "message": "My parcel is three days late."},
    {"id": "address", "message": "Can I change my delivery address?"},
    {"id": "thanks", "message": "Thanks, the replacement arrived."},
]
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 3  # each takes a few seconds on 2 cores
OUT = "runs/my_agent_cpu"


def reward(reply: str) -> float:
    """Your scoring goes here; this one prefers replies in plain letters (see the top)."""
    return sum(c.isascii() and (c.isalpha() or c == " ") for c in reply) / max(len(reply), 1)


async def main() -> None:
    backend = at.CPUBackend(threads=1, keep_checkpoints=1)
    model: art.TrainableModel = art.TrainableModel(
        name="my-agent",
        project="my-project",
        run_name="cpu",
        base_model="arttrace/tiny-qwen2",
        base_path=f"{OUT}/.art",
    )
    await model.register(backend)  # serves the model (its latest checkpoint, if any)
    client = AsyncOpenAI(base_url=model.inference_base_url, api_key=model.inference_api_key)

    @at.trainable  # the agent: its LLM calls are the policy's turns
    async def support_agent(message: str) -> str:
        response = await client.chat.completions.create(
            model=model.get_inference_name(),
            messages=[
                {"role": "system", "content": "You answer customers of an online shop."},
                {"role": "user", "content": message},
            ],
            max_tokens=8,
        )
        return response.choices[0].message.content or ""

    async def rollout(example: dict) -> float:  # one run of the agent on one example
        return reward(await support_agent(example["message"]))

    trainer = at.Trainer(
        model,
        backend,
        rollout,
        EXAMPLES,
        group_size=4,
        groups_per_step=2,
        learning_rate=3e-3,
        output_dir=OUT,
        progress=False,
        resume=True,  # a second run continues from the last step
    )
    try:
        async with trainer:  # closed on exit (the worker threads of sync rollouts, if any)
            results = await trainer.train(num_steps=trainer.completed_steps + STEPS)
    finally:
        await client.close()
        await backend.close()
    for r in results:
        m = r.metrics
        print(
            f"step {r.step}: reward {m['reward_mean']:.2f}, {m['groups_kept']:.0f} groups "
            f"shipped, loss {m.get('train/loss', float('nan')):.3f}"
        )
    print(f"metrics, reward plot and every run: {OUT}/")


if __name__ == "__main__":
    asyncio.run(main())
