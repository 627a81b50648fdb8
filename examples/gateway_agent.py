"""A calculator agent that knows nothing of arttrace: plain OpenAI SDK code with one tool.

    OPENAI_BASE_URL=... OPENAI_API_KEY=... python examples/gateway_agent.py "What is 2+3?"

`examples/gateway_trainer.py` starts it as a subprocess for each rollout, with its run's
gateway URL as OPENAI_BASE_URL; any language's OpenAI client would do the same.
"""

import json
import sys

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


def main(question: str) -> str:
    client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "You are a calculator. Use the add tool."},
        {"role": "user", "content": question},
    ]
    while True:
        stream = client.chat.completions.create(
            model="calculator-policy",
            messages=messages,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            stream=True,
        )
        content, calls = "", {}  # the answer as it streams in, tool calls by index
        for chunk in stream:
            delta = chunk.choices[0].delta if chunk.choices else None
            if delta is None:
                continue
            content += delta.content or ""
            for part in delta.tool_calls or ():
                call = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
                call["id"] = part.id or call["id"]
                call["name"] += (part.function and part.function.name) or ""
                call["arguments"] += (part.function and part.function.arguments) or ""
        if not calls:
            return content
        tool_calls = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for c in calls.values()
        ]
        messages.append({"role": "assistant", "content": content or None, "tool_calls": tool_calls})
        for call in tool_calls:
            args = json.loads(call["function"]["arguments"])
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": str(args["a"] + args["b"])}
            )


if __name__ == "__main__":
    print(main(sys.argv[1]))
