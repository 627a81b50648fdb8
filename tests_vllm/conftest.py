"""Fixtures for the capture contract against a real vLLM server (opt in: `make test-vllm`).

The server is started by `.ci/vllm/run.sh`, which passes its address in ``ARTTRACE_VLLM_URL``
(``http://127.0.0.1:<port>/v1``), the served model name in ``ARTTRACE_VLLM_MODEL`` and the
model folder (for its tokenizer) in ``ARTTRACE_VLLM_MODEL_DIR``. The server must run with
``--return-tokens-as-token-ids --enable-auto-tool-choice --tool-call-parser hermes`` and a
``<think>`` reasoning parser, ``--structured-outputs-config '{"enable_in_reasoning": true}'``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from contract import model_name
from raw import Tee

import arttrace as at
from arttrace.capture import _warnings


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "reasoning: needs a server started with a reasoning parser")


def _setting(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.exit(
            f"{name} is not set: these tests need a running vLLM server. Run `make test-vllm`, "
            "which builds one and sets it (see docs/testing.md, 'Against a real vLLM').",
            returncode=4,
        )
    return value


@pytest.fixture(scope="session")
def base_url() -> str:
    url = _setting("ARTTRACE_VLLM_URL").rstrip("/")
    try:
        models = httpx.get(f"{url}/models", timeout=10).json()
    except httpx.HTTPError as exc:
        pytest.exit(f"no vLLM server answers at {url}: {exc}", returncode=4)
    served = [m["id"] for m in models["data"]]
    if model_name() not in served:
        pytest.exit(f"{url} serves {served}, not {model_name()}", returncode=4)
    return url


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    """The served model's tokenizer (Qwen2.5's, plus Qwen3's <think> tokens), for ART."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(_setting("ARTTRACE_VLLM_MODEL_DIR"))


@pytest.fixture
def tee() -> Iterator[Tee]:
    transport = Tee()
    yield transport
    transport.close()


@pytest.fixture
def client(base_url: str, tee: Tee) -> Iterator[openai.OpenAI]:
    http = httpx.Client(transport=tee, timeout=300)
    yield openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, http_client=http)
    http.close()


@pytest.fixture(autouse=True)
def instrumented() -> Iterator[None]:
    at.instrument()
    yield
    at.uninstrument()
    _warnings.reset()
