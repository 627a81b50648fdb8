"""instrument() and uninstrument(): light, lazy, and polite to other libraries' wrappers of the
same methods (an APM agent's ``wrapt`` wrapper, a hand-written one, ART's own capture)."""

from __future__ import annotations

import functools
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
import wrapt
from openai.resources.chat.completions import AsyncCompletions, Completions

import arttrace as at
from arttrace.capture import _warnings
from arttrace.capture._unwrap import ours
from arttrace.testing import Reply, ScriptedLLM

USER = [{"role": "user", "content": "q"}]


@pytest.fixture
def pristine() -> Iterator[None]:
    """Whatever a test stacks on the SDK's methods is taken off afterwards."""
    saved = {
        (cls, name): cls.__dict__[name]
        for cls in (Completions, AsyncCompletions)
        for name in ("create", "parse")
    }
    yield
    at.uninstrument()
    for (cls, name), value in saved.items():
        setattr(cls, name, value)


def _client(replies: int = 4) -> openai.OpenAI:
    llm = ScriptedLLM([Reply(f"r{i}") for i in range(replies)])
    return openai.OpenAI(
        base_url="http://llm.test/v1",
        api_key="k",
        http_client=httpx.Client(transport=llm.transport()),
    )


def _calls_recorded(client: openai.OpenAI) -> int:
    """The calls one run recorded; a run that recorded none must say so (never silent)."""
    _warnings.reset()  # the warning is once per process: each run here may give it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with at.trajectory("ex") as t:
            at.trainable(client.chat.completions.create)(model="policy", messages=USER)
    told = [w for w in caught if issubclass(w.category, at.NothingToTrainWarning)]
    assert len(told) == (0 if t.calls else 1), [str(w.message) for w in told]
    for w in caught:  # anything else is not this helper's to swallow
        if w not in told:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return len(t.calls)


def _their_wrapper(seen: list[str]) -> Callable[..., Any]:
    def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        seen.append("theirs")
        return wrapped(*args, **kwargs)

    return wrapper


def test_another_wrapt_wrapper_outside_ours_is_kept(pristine):
    original = Completions.__dict__["create"]
    client, seen = _client(), []
    at.instrument()
    wrapt.wrap_function_wrapper(Completions, "create", _their_wrapper(seen))
    theirs = Completions.__dict__["create"]
    assert _calls_recorded(client) == 1 and seen == ["theirs"]

    at.uninstrument()
    assert Completions.__dict__["create"] is theirs  # their wrapper is where they put it
    assert theirs.__wrapped__ is original  # ours is spliced out from under it
    assert _calls_recorded(client) == 0 and seen == ["theirs"] * 2

    at.instrument()  # and capture comes back, once
    assert _calls_recorded(client) == 1 and seen == ["theirs"] * 3


def test_another_wrapt_wrapper_inside_ours_is_kept(pristine):
    client, seen = _client(), []
    wrapt.wrap_function_wrapper(Completions, "create", _their_wrapper(seen))
    theirs = Completions.__dict__["create"]
    at.instrument()
    assert ours(Completions.__dict__["create"])
    assert _calls_recorded(client) == 1 and seen == ["theirs"]
    at.uninstrument()
    assert Completions.__dict__["create"] is theirs
    assert _calls_recorded(client) == 0 and seen == ["theirs"] * 2


def test_a_plain_outer_wrapper_keeps_ours_inert_and_instrument_works_again(pristine):
    client, seen = _client(), []
    at.instrument()
    inner = Completions.create

    @functools.wraps(inner)
    def theirs(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append("theirs")
        return inner(self, *args, **kwargs)

    Completions.create = theirs  # type: ignore[method-assign]
    at.uninstrument()
    assert Completions.__dict__["create"] is theirs  # cannot splice into a plain function
    assert _calls_recorded(client) == 0 and seen == ["theirs"]  # ours, below it, is inert

    at.instrument()  # a new wrapper goes on top; the inert one below stays out of the way
    assert _calls_recorded(client) == 1 and seen == ["theirs"] * 2
    at.uninstrument()
    assert _calls_recorded(client) == 0 and seen == ["theirs"] * 3


def test_uninstrument_next_to_arts_own_capture(pristine):
    import art

    client = _client()
    with art.Trajectory() as art_scope:  # installs ART's patches of httpx, aiohttp, requests
        arts_send = httpx.Client.send
        at.instrument()
        at.uninstrument()
        at.instrument()
        assert _calls_recorded(client) == 1
        at.uninstrument()
        assert httpx.Client.send is arts_send and getattr(arts_send, "_art_capture", False)
        assert _calls_recorded(client) == 0
    assert len(art_scope.exchanges.chat_completions) == 2  # ART saw both calls


def _run(script: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_import_and_instrument_load_neither_art_torch_openai_nor_wrapt():
    loaded = _run(
        """
        import sys
        import arttrace
        arttrace.instrument()
        print(sorted(m for m in ("art", "torch", "openai", "wrapt") if m in sys.modules))
        """
    )
    assert loaded == "[]"


def test_instrument_before_importing_openai_patches_it_on_import():
    result = _run(
        """
        import sys
        import arttrace as at
        at.instrument()
        assert "openai" not in sys.modules
        from openai.resources.chat.completions import AsyncCompletions, Completions
        from arttrace.capture._unwrap import ours
        assert ours(Completions.__dict__["create"]) and ours(AsyncCompletions.__dict__["create"])
        import httpx, openai
        from arttrace.testing import ScriptedLLM
        client = openai.OpenAI(base_url="http://x/v1", api_key="k",
                               http_client=httpx.Client(transport=ScriptedLLM().transport()))
        with at.trajectory("ex") as t:
            at.trainable(client.chat.completions.create)(
                model="m", messages=[{"role": "user", "content": "hi"}])
        print(len(t.calls), t.trainable_turns)
        """
    )
    assert result == "1 1"
