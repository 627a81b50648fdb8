"""Spans: the user's own TracerProvider sees GenAI spans; without one, none is installed."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import arttrace as at
from arttrace.testing import Reply, ScriptedLLM


def test_user_provider_receives_genai_spans(clients, spans):
    client, _ = clients(ScriptedLLM([Reply("traced"), Reply("again")]))
    at.instrument()
    try:

        @at.trainable(name="solver")
        def solve() -> None:
            client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "q"}], temperature=0.5
            )
            list(
                client.chat.completions.create(
                    model="policy",
                    messages=[{"role": "user", "content": "q"}],
                    stream=True,
                    stream_options={"include_usage": True},
                )
            )

        with at.trajectory("ex-9"):
            solve()
    finally:
        at.uninstrument()
    by_name = {s.name: s for s in spans.get_finished_spans()}
    chat = [s for s in spans.get_finished_spans() if s.name == "chat policy"]
    assert len(chat) == 2
    attrs = chat[0].attributes
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == "policy" and attrs["gen_ai.request.temperature"] == 0.5
    assert attrs["gen_ai.response.model"] == "policy"
    assert attrs["gen_ai.usage.output_tokens"] > 0 and attrs["gen_ai.usage.input_tokens"] > 0
    assert attrs["gen_ai.response.finish_reasons"] == ("stop",)
    assert attrs["arttrace.trainable"] is True and attrs["arttrace.example_id"] == "ex-9"
    assert chat[1].attributes["gen_ai.usage.output_tokens"] > 0  # streamed, usage chunk
    assert not any(k.endswith(("token_ids", "logprobs")) for s in chat for k in s.attributes)
    trainable_span, trajectory_span = by_name["trainable solver"], by_name["trajectory ex-9"]
    assert all(s.parent.span_id == trainable_span.context.span_id for s in chat)
    assert trainable_span.parent.span_id == trajectory_span.context.span_id


def test_export_tokens_puts_them_on_spans(clients, spans):
    client, _ = clients(ScriptedLLM([Reply("tokens")]))
    at.instrument(export_tokens=True)
    try:
        with at.trajectory("ex") as t:
            at.trainable(client.chat.completions.create)(
                model="policy", messages=[{"role": "user", "content": "q"}]
            )
    finally:
        at.uninstrument()
    (span,) = [s for s in spans.get_finished_spans() if s.name == "chat policy"]
    choice = t.calls[0].choices[0]
    assert list(span.attributes["arttrace.choice.0.token_ids"]) == choice.token_ids.tolist()
    assert list(span.attributes["arttrace.choice.0.logprobs"]) == choice.logprobs.tolist()


def test_no_provider_is_installed_when_the_user_has_none():
    script = textwrap.dedent(
        """
        import openai, httpx
        from opentelemetry import trace
        import arttrace as at
        from arttrace.testing import ScriptedLLM
        at.instrument()
        llm = ScriptedLLM()
        client = openai.OpenAI(base_url="http://x/v1", api_key="k",
                               http_client=httpx.Client(transport=llm.transport()))
        with at.trajectory("ex") as t:
            at.trainable(client.chat.completions.create)(
                model="m", messages=[{"role": "user", "content": "hi"}])
        assert t.trainable_turns == 1
        assert type(trace.get_tracer_provider()).__name__ == "ProxyTracerProvider"
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
