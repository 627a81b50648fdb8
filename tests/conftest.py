from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at litellm import

from collections.abc import Callable, Iterator

import openai
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import arttrace as at
from arttrace.capture import _warnings
from arttrace.testing import LLMServer, ScriptedLLM, serve


@pytest.fixture
def instrumented() -> Iterator[None]:
    at.instrument()
    yield
    at.uninstrument()
    _warnings.reset()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """A user's OpenTelemetry provider (one per process), exporting this test's spans."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    processor = SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    yield exporter
    processor.shutdown()


@pytest.fixture
def server() -> Iterator[Callable[[ScriptedLLM], LLMServer]]:
    started: list[LLMServer] = []

    def start(llm: ScriptedLLM) -> LLMServer:
        started.append(serve(llm))
        return started[-1]

    yield start
    for s in started:
        s.stop()


@pytest.fixture
def clients(
    server: Callable[[ScriptedLLM], LLMServer],
) -> Iterator[Callable[..., tuple[openai.OpenAI, openai.AsyncOpenAI]]]:
    """Sync and async clients talking to a fresh scripted server over loopback HTTP. The sync
    clients are closed after the test (their sockets would otherwise be left to the garbage
    collector, a ResourceWarning); an async client belongs to the loop that used it and is
    closed by the test inside that loop."""
    made: list[openai.OpenAI] = []

    def make(llm: ScriptedLLM) -> tuple[openai.OpenAI, openai.AsyncOpenAI]:
        url = server(llm).base_url
        made.append(openai.OpenAI(base_url=url, api_key="test", max_retries=0))
        return made[-1], openai.AsyncOpenAI(base_url=url, api_key="test", max_retries=0)

    yield make
    for client in made:
        client.close()
