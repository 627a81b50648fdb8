"""A LlamaIndex FunctionAgent with two tools, captured for ART training.

Runs offline against arttrace's scripted vLLM-like server:  python examples/llama_index_agent.py
Point `api_base` at your vLLM / ART inference server to capture a real model instead (use
`llama_index.llms.openai_like.OpenAILike(model=..., is_chat_model=True,
is_function_calling_model=True)` for a model name LlamaIndex's `OpenAI` does not know).
"""

import asyncio

from llama_index.core.agent.workflow import FunctionAgent
from llama_index.llms.openai import OpenAI

import arttrace as at
from arttrace.testing import Reply, ScriptedLLM, ToolCall, serve

at.instrument()  # patches the OpenAI SDK and hooks LlamaIndex when it is imported


def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


# What the scripted model answers, turn by turn (a real model decides for itself).
SCRIPT = [
    Reply(tool_calls=[ToolCall("add", {"a": 2, "b": 3})]),
    Reply(tool_calls=[ToolCall("multiply", {"a": 5, "b": 4})]),
    Reply("(2 + 3) * 4 = 20"),
]


async def main() -> None:
    with serve(ScriptedLLM(SCRIPT)) as server:
        # LlamaIndex's OpenAI class accepts only model names it knows.
        llm = OpenAI(model="gpt-4o-mini", api_base=server.base_url, api_key="local")
        agent = FunctionAgent(
            name="calculator", tools=[add, multiply], llm=llm, system_prompt="Use the tools."
        )

        @at.trainable  # the LLM calls made in here are the policy's turns
        async def solve(question: str) -> str:
            return str(await agent.run(question))

        async with at.trajectory(example_id="calc-1") as t:
            answer = await solve("What is (2 + 3) * 4?")
            t.reward = float("20" in answer)

    for call in t.calls:
        print(f"call by {call.framework}/{call.step}: trainable={call.trainable}")
    print("ART trajectory:")
    for item in t.to_art().messages_and_choices:
        if isinstance(item, dict):
            print(f"   {item['role']:<9} {item.get('content')!r}  {item.get('tool_call_id', '')}")
        else:
            calls = [(c.id, c.function.name) for c in item.message.tool_calls or ()]
            tokens = len(item.logprobs.content) if item.logprobs and item.logprobs.content else 0
            print(f"   Choice    {item.message.content!r} {calls}  {tokens} tokens")


if __name__ == "__main__":
    asyncio.run(main())
