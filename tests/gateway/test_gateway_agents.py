"""Agents in other processes train through the gateway unchanged: a Python process using the
OpenAI SDK with tools, and a Node.js agent using the npm ``openai`` package."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import arttrace as at
from arttrace.gateway import Gateway
from arttrace.testing import Reply, ScriptedLLM, ToolCall
from support.common import TOOLS
from support.gateway import RecordingUpstream

KEY = "sk-agent-key-123456"
PYTHON_AGENT = """
import json, os
from openai import OpenAI

client = OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
tools = json.loads(os.environ["TOOLS"])
messages = [{"role": "user", "content": "What is 2+3?"}]
create = client.chat.completions.with_raw_response.create
raw = create(model="policy", messages=messages, tools=tools)
message = raw.parse().choices[0].message
messages.append(message.model_dump(exclude_none=True))
for call in message.tool_calls:
    args = json.loads(call.function.arguments)
    result = str(args["a"] + args["b"])
    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
stream = client.chat.completions.create(model="policy", messages=messages, tools=tools, stream=True)
answer = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
print(json.dumps({"answer": answer, "raw": [raw.http_response.content.decode()]}))
"""

NODE_AGENT = """
import OpenAI from 'openai';

const client = new OpenAI({ maxRetries: 0 }); // OPENAI_BASE_URL, OPENAI_API_KEY
const tools = JSON.parse(process.env.TOOLS);
const messages = [{ role: 'user', content: 'What is 2+3?' }];
const create = (body) =>
  client.chat.completions.create({ model: 'policy', messages, tools, ...body });
const stream = await create({ stream: true });
let content = '';
const slots = {};
for await (const chunk of stream) {
  const delta = chunk.choices[0]?.delta;
  if (!delta) continue;
  if (delta.content) content += delta.content;
  for (const tc of delta.tool_calls ?? []) {
    const slot = (slots[tc.index] ??= { id: '', name: '', arguments: '' });
    if (tc.id) slot.id = tc.id;
    if (tc.function?.name) slot.name += tc.function.name;
    if (tc.function?.arguments) slot.arguments += tc.function.arguments;
  }
}
const toolCalls = Object.values(slots).map((s) => ({
  id: s.id, type: 'function', function: { name: s.name, arguments: s.arguments },
}));
messages.push({ role: 'assistant', content: content || null, tool_calls: toolCalls });
for (const call of toolCalls) {
  const args = JSON.parse(call.function.arguments);
  messages.push({ role: 'tool', tool_call_id: call.id, content: String(args.a + args.b) });
}
const response = await create({}).asResponse();
const raw = await response.text();
console.log(JSON.stringify({ answer: JSON.parse(raw).choices[0].message.content, raw: [raw] }));
"""


def calculator() -> ScriptedLLM:
    def respond(request: dict[str, Any]) -> Reply:
        last = request["messages"][-1]
        if last["role"] == "tool":
            return Reply(f"The answer is {last['content']}.")
        return Reply("Let me add.", tool_calls=[ToolCall("add", {"a": 2, "b": 3})])

    return ScriptedLLM(respond)


@pytest.fixture(scope="module")
def node_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The Node agent, beside the npm ``openai`` package installed for it."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail("the Node.js agent test needs node and npm on PATH (Node 20 or later)")
    folder = tmp_path_factory.mktemp("node-agent")
    installed = subprocess.run(
        [npm, "install", "--prefix", str(folder), "--no-audit", "--no-fund", "openai@5"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if installed.returncode != 0:
        pytest.fail(
            "npm could not install the `openai` package, so the Node.js agent cannot run; "
            f"check that the npm registry is reachable.\n{installed.stderr[-2000:]}"
        )
    script = folder / "agent.mjs"
    script.write_text(NODE_AGENT)
    yield script


def run_agent(command: list[str], url: str) -> dict[str, Any]:
    env = {
        **os.environ,
        "OPENAI_BASE_URL": url,
        "OPENAI_API_KEY": KEY,
        "TOOLS": json.dumps(TOOLS),
    }
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def train_agent(command: list[str]) -> None:
    """One run of the agent through the gateway: both of its calls are trainable policy turns
    with the upstream's exact tokens, the tool call and its result in order, and the agent
    got the upstream's bytes."""
    with (
        RecordingUpstream(calculator()) as upstream,
        Gateway(upstream.base_url) as gateway,
        at.trajectory("q-1") as t,
    ):
        out = run_agent(command, gateway.url(t))
        t.reward = float(out["answer"] == "The answer is 5.")
    assert t.reward == 1.0
    whole = [e for e in upstream.exchanges if not e.body.get("stream")]
    assert out["raw"] == [e.answered.decode() for e in whole]
    assert all(e.headers["authorization"] == f"Bearer {KEY}" for e in upstream.exchanges)
    assert [c.trainable for c in t.calls] == [True, True]
    for call, exchange in zip(t.calls, upstream.exchanges, strict=True):
        assert exchange.body["logprobs"] is True and exchange.body["return_token_ids"] is True
        choice = call.choices[0]
        assert call.untrainable_reason(choice) is None
        assert call.prompt_token_ids is not None and choice.token_ids is not None
    (conversation,) = t.conversations()
    assert conversation.trainable_turns == 2
    roles = [item["role"] if isinstance(item, dict) else "turn" for item in conversation.items]
    assert roles == ["user", "turn", "tool", "turn"]
    tool = conversation.items[2]
    assert isinstance(tool, dict) and tool["content"] == "5"
    assert KEY not in json.dumps(t.to_dict())


def test_a_python_process_with_the_openai_sdk_and_tools(tmp_path: Path) -> None:
    script = tmp_path / "agent.py"
    script.write_text(PYTHON_AGENT)
    train_agent([sys.executable, str(script)])


def test_a_nodejs_agent_with_the_npm_openai_package(node_agent: Path) -> None:
    train_agent(["node", str(node_agent)])
