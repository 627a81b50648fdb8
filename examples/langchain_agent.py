"""A LangGraph ReAct agent with two tools, captured for ART training.

Runs offline against arttrace's scripted vLLM-like server:  python examples/langchain_agent.py
Point `base_url` at your vLLM / ART inference server to capture a real model instead.
"""

import asyncio
import warnings
from typing import Any

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent

import arttrace as at
from arttrace.testing import Reply, ScriptedLLM, ToolCall, serve

at.instrument()  # patches the OpenAI SDK and hooks LangChain when it is imported


@tool
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


@tool
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
        model = ChatOpenAI(base_url=server.base_url, api_key="local", model="my-policy")
        with warnings.catch_warnings():  # moved to langchain.agents.create_agent in LangGraph 1
            warnings.simplefilter("ignore", DeprecationWarning)
            agent = create_react_agent(model, [add, multiply], prompt="Use the tools.")

        @at.trainable  # the LLM calls made in here are the policy's turns
        async def solve(question: str) -> Any:
            return await agent.ainvoke({"messages": [("user", question)]})

        async with at.trajectory(example_id="calc-1") as t:
            result = await solve("What is (2 + 3) * 4?")
            t.reward = float("20" in str(result["messages"][-1].content))

    print(f"reward {t.reward}, {t.trainable_turns} trainable turns")
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
