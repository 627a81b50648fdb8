"""A Google ADK agent with tools, captured for training with OpenPipe ART.

Runs offline against arttrace's scripted vLLM-like server:  python examples/google_adk_agent.py
For a real model, point ``api_base`` at your vLLM / ART inference server.
"""

import asyncio
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM: no network at import

from google.adk.agents import LlmAgent
from google.adk.models.lite_llm import LiteLlm
from google.adk.runners import InMemoryRunner
from google.genai import types
from openai.types.chat.chat_completion import Choice

import arttrace as at
from arttrace.testing import Reply, ScriptedLLM, ToolCall, serve

at.instrument()  # patches the OpenAI SDK and adds arttrace's plugin to every ADK Runner


def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


async def main() -> None:
    script = [  # what the scripted model answers, turn by turn
        Reply(tool_calls=[ToolCall("add", {"a": 2, "b": 3})]),
        Reply(tool_calls=[ToolCall("multiply", {"a": 5, "b": 4})]),
        Reply("(2 + 3) * 4 = 20"),
    ]
    with serve(ScriptedLLM(script)) as server:
        agent = LlmAgent(
            name="calculator",
            # LiteLLM's "openai/" route goes through the OpenAI SDK, where arttrace reads the
            # exact tokens; the server sees the model name "my-policy".
            model=LiteLlm(model="openai/my-policy", api_base=server.base_url, api_key="local"),
            instruction="Compute with the tools, one step at a time.",
            tools=[add, multiply],
        )
        runner = InMemoryRunner(agent=agent, app_name="calculator")

        @at.trainable  # the model calls made in here are the policy's turns
        async def solve(question: str) -> str:
            session = await runner.session_service.create_session(
                app_name="calculator", user_id="user"
            )
            message = types.Content(role="user", parts=[types.Part(text=question)])
            answer = ""
            async for event in runner.run_async(
                user_id="user", session_id=session.id, new_message=message
            ):
                if event.is_final_response() and event.content and event.content.parts:
                    answer = event.content.parts[0].text or ""
            return answer

        async with at.trajectory(example_id="q-17") as t:
            answer = await solve("What is (2 + 3) * 4?")
            t.reward = float("20" in answer)

    print(f"answer: {answer!r}; {len(t.calls)} model calls, {t.trainable_turns} trainable turns")
    for call in t.calls:
        print(f"  {call.framework}/{call.step}: {len(call.choices[0].token_ids or ())} tokens")
    for item in t.to_art().messages_and_choices:
        if isinstance(item, Choice):
            message = item.message
            calls = [f"{c.function.name}({c.function.arguments})" for c in message.tool_calls or ()]
            print(f"  Choice    {message.content or ', '.join(calls)}  (logprobs: yes)")
        else:
            print(f"  {item['role']:<9} {item.get('content')!r}")


if __name__ == "__main__":
    asyncio.run(main())
