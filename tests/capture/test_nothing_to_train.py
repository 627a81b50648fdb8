"""Never silent: a run whose @trainable code ran but recorded no policy turn says why, once."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator

import openai
import pytest

import arttrace as at
from arttrace.capture import _warnings
from arttrace.testing import LLMServer, ScriptedLLM
from support.common import warnings_are_errors


@pytest.fixture(autouse=True)
def _fresh_warnings() -> Iterator[None]:
    _warnings.reset()
    yield
    _warnings.reset()


@pytest.fixture
def url(server: Callable[[ScriptedLLM], LLMServer]) -> str:
    return server(ScriptedLLM()).base_url


def ask(client: openai.OpenAI) -> None:
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])


def runs(n: int, agent: Callable[[], None]) -> list[warnings.WarningMessage]:
    """``n`` runs of ``agent``; the NothingToTrainWarnings they gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(n):
            with at.trajectory(f"ex-{i}") as t:
                agent()
                t.reward = 1.0
    return [w for w in caught if issubclass(w.category, at.NothingToTrainWarning)]


def test_without_instrument_the_run_says_so_once(url: str) -> None:
    client = openai.OpenAI(base_url=url, api_key="k", max_retries=0)
    [warning] = runs(3, at.trainable(lambda: ask(client)))
    message = str(warning.message)
    assert "run 'ex-0'" in message and "arttrace.instrument() was not called" in message
    assert "wrap_openai" in message
    assert warning.filename == __file__  # it points at the user's code, not arttrace's


def test_calls_outside_trainable_are_named(url: str, instrumented: None) -> None:
    client = openai.OpenAI(base_url=url, api_key="k", max_retries=0)

    @at.trainable
    def plan() -> str:
        return "no model call in here"

    def agent() -> None:
        plan()
        ask(client)  # the policy's call, made outside the @trainable function

    [warning] = runs(2, agent)
    assert "its LLM calls ran outside every @trainable function" in str(warning.message)


def test_a_call_arttrace_cannot_see_is_named(url: str, instrumented: None) -> None:
    @at.trainable
    def agent() -> None:  # the model is called from another process: no layer here sees it
        body = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "hi"}]})
        subprocess.run(
            [sys.executable, "-c", SEND, f"{url}/chat/completions", body], check=True, timeout=60
        )

    [warning] = runs(2, agent)
    assert "no LLM call was seen" in str(warning.message)
    assert "arttrace.Gateway" in str(warning.message)


SEND = """
import sys, urllib.request
request = urllib.request.Request(
    sys.argv[1], sys.argv[2].encode(), {"content-type": "application/json"}
)
urllib.request.urlopen(request).read()
"""


def test_a_run_with_a_policy_turn_or_without_policy_code_is_quiet(
    url: str, instrumented: None
) -> None:
    client = openai.OpenAI(base_url=url, api_key="k", max_retries=0)
    assert runs(2, at.trainable(lambda: ask(client))) == []
    assert runs(2, lambda: ask(client)) == []  # no @trainable code ran: context only, by design


def test_the_warning_never_becomes_the_callers_exception(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = openai.OpenAI(base_url=url, api_key="k", max_retries=0)
    with warnings_are_errors(), at.trajectory("strict") as t:
        at.trainable(lambda: ask(client))()
        t.reward = 0.5
    assert t.ended_at is not None
    assert "arttrace.instrument() was not called" in caplog.text
