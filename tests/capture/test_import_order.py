"""Whatever the application imported first, arttrace loads and captures: every public name and
documented entry point in a fresh interpreter, plain, after ``instrument()``, after importing
``anthropic`` first and ``httpx2`` first; agents that use only the Anthropic SDK or only
httpx train every turn; ``uninstrument()`` undoes all that ``instrument()`` did."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import arttrace
from arttrace.testing import Reply, ScriptedLLM, serve

ROOT = Path(__file__).resolve().parents[2]
PRELUDES = {
    "plain": "import arttrace as at\n",
    "instrument()": "import arttrace as at\nat.instrument()\n",
    "anthropic first": "import anthropic\nimport arttrace as at\nat.instrument()\n",
    "httpx2 first": "import httpx2\nimport arttrace as at\nat.instrument()\n",
}
LAZY = {
    "CPUBackend", "Curriculum", "DryRunBackend", "StepResult", "Trainer",
    "Group", "GroupRewardFn", "GroupRewards", "GroupRun", "RayExecutor", "open_run", "Gateway",
    "RunContinuity", "run_continuity",
}  # fmt: skip
"""The names of ``arttrace`` loaded on first use: each first use is its own entry point."""
MODULES = (
    "arttrace.integrations.openai_agents",
    "arttrace.integrations.dspy",
    "arttrace.translation",
    "arttrace.viewer",
    "arttrace.app.cli",
)
"""Entry points documented outside docs/reference.md (framework pages, the CLI)."""
HEAVY = {
    "arttrace.CPUBackend", "arttrace.Gateway", "arttrace.RayExecutor", "arttrace.testing",
    "arttrace.integrations.dspy", "arttrace.integrations.google_adk",
    "arttrace.integrations.langchain", "arttrace.integrations.llama_index",
    "arttrace.integrations.openai_agents",
}  # fmt: skip
"""Entry points that load seconds of libraries (CPUBackend: torch, 37 s of CPU; the rest 4-10 s;
the others under 0.5 s): tried once, in the order that leaves the most hooks waiting while they
load (``instrument()`` with only ``anthropic``, and so ``httpx2``, imported: ``openai``,
``httpx`` and every framework still to come)."""


def _documented() -> set[str]:
    """The public names: ``arttrace.__all__`` and every name docs/reference.md documents."""
    reference = (ROOT / "docs" / "reference.md").read_text()
    return {f"arttrace.{n}" for n in arttrace.__all__} | set(
        re.findall(r"^::: (arttrace\.\S+)", reference, re.MULTILINE)
    )


def _entry_points() -> dict[str, list[str]]:
    """What a fresh interpreter loads first -> the names it gives. A module is loaded whole
    before any of its names is read, so the names of one module are one entry point; each
    lazy name of ``arttrace`` is its own."""
    points: dict[str, list[str]] = {m: [] for m in MODULES}
    for name in sorted(_documented()):
        module, _, attr = name.rpartition(".")
        key = name if module == "arttrace" and attr in LAZY else module
        points.setdefault(key, []).append(name)
    return points


def _probe(prelude: str, names: list[str], module: str) -> str:
    reads = "".join(
        f"getattr(importlib.import_module({n.rpartition('.')[0]!r}), {n.rpartition('.')[2]!r})\n"
        for n in names
    )
    return f"{PRELUDES[prelude]}import importlib\nimportlib.import_module({module!r})\n{reads}"


def _python(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )


def _clean(out: subprocess.CompletedProcess[str]) -> bool:
    return out.returncode == 0 and not re.search(r"ERROR|Traceback|arttrace failed", out.stderr)


def test_every_public_name_loads_in_every_import_order():
    points = _entry_points()
    assert {"arttrace.Gateway", "arttrace.testing", "arttrace.store"} <= set(points)
    combos = [
        (prelude, point)
        for prelude in PRELUDES
        for point in points
        if point not in HEAVY or prelude == "anthropic first"
    ]

    def check(combo: tuple[str, str]) -> str | None:
        prelude, point = combo
        module = "arttrace" if point.rpartition(".")[2] in LAZY else point
        out = _python(_probe(prelude, points[point], module))
        if _clean(out):
            return None
        return f"{prelude} + {point}: {out.stderr.strip().splitlines()[-1:]}"

    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        failures = [f for f in pool.map(check, combos) if f]
    assert not failures, f"{len(failures)} of {len(combos)} failed:\n" + "\n".join(failures)


AGENTS = {
    "anthropic": """
        import sys
        import arttrace as at
        at.instrument(translate="messages")
        import anthropic
        client = anthropic.Anthropic(base_url=sys.argv[1], api_key="k")

        @at.trainable
        def agent():
            messages = [{"role": "user", "content": "hi"}]
            for _ in range(3):
                reply = client.messages.create(model="policy", max_tokens=50, messages=messages)
                messages += [{"role": "assistant", "content": reply.content[0].text},
                             {"role": "user", "content": "more"}]
        """,
    "httpx": """
        import sys
        {first}
        import arttrace as at
        at.instrument()
        import httpx
        client = httpx.Client(base_url=sys.argv[1] + "/v1")

        @at.trainable
        def agent():
            messages = [{"role": "user", "content": "hi"}]
            for _ in range(3):
                answer = client.post("/chat/completions", json={"model": "policy",
                                     "messages": messages}).json()
                messages += [answer["choices"][0]["message"], {"role": "user", "content": "more"}]
        """,
}
RUN = """
        with at.trajectory("ex") as t:
            agent()
        print(len(t.calls), t.trainable_turns)
"""


@pytest.mark.parametrize(
    "agent",
    ["anthropic", "httpx", "httpx2 first", "anthropic first"],
)
def test_an_agent_of_one_client_trains_every_turn_in_a_fresh_interpreter(agent):
    """No ``openai`` imported by the application: the first call loads what capture needs,
    and still trains."""
    first = {"httpx2 first": "import httpx2", "anthropic first": "import anthropic"}
    script = AGENTS["httpx" if agent in first else agent].replace("{first}", first.get(agent, ""))
    with serve(ScriptedLLM(lambda request: Reply("ok"))) as server:
        out = _python(script + RUN, server.base_url.removesuffix("/v1"))
    assert _clean(out), out.stderr
    assert out.stdout.split() == ["3", "3"]


def test_uninstrument_undoes_all_that_instrument_did():
    """100 cycles, before and after the libraries are imported, leave no hook waiting, no
    flag set, no patch in place; instrumented again, a call is recorded once."""
    out = _python(
        """
        import sys, threading
        from concurrent.futures import ThreadPoolExecutor
        import arttrace as at
        from arttrace.capture import _imports

        def leftovers():
            from arttrace.translation import _inprocess
            left = [f"waiting {n}" for n, count in _imports.waiting().items() if count]
            left += [f"finder {f}" for f in sys.meta_path if type(f).__name__ == "_Finder"]
            left += ["translation"] * bool(_inprocess.active())
            patched = [threading.Thread.start, ThreadPoolExecutor.submit]
            for name in ("httpx", "httpx2"):
                if name in sys.modules:
                    lib = sys.modules[name]
                    patched += [lib.Client.__dict__["send"], lib.AsyncClient.__dict__["send"]]
            if "openai" in sys.modules:
                from openai.resources.chat.completions import Completions
                from openai.resources.responses import Responses
                patched += [Completions.__dict__["create"], Responses.__dict__["create"]]
            left += [
                f"patch {p}" for p in patched
                if type(p).__module__.startswith("wrapt")  # ours, or translation's stand-aside
                or getattr(p, "__module__", "").startswith("arttrace")  # the thread patches
            ]
            return left

        for cycle in range(100):
            at.instrument(translate="responses")
            with at.trajectory("ex", translate="messages"):
                pass
            at.uninstrument()
            if cycle == 49:
                import anthropic, httpx, httpx2, openai
            assert not leftovers(), (cycle, leftovers())

        at.instrument()
        from openai import OpenAI
        import httpx
        from arttrace.testing import Reply, ScriptedLLM
        client = OpenAI(base_url="http://llm.test/v1", api_key="k",
                        http_client=httpx.Client(transport=ScriptedLLM([Reply("a")]).transport()))
        with at.trajectory("ex") as t:
            at.trainable(client.chat.completions.create)(
                model="m", messages=[{"role": "user", "content": "hi"}])
        print(len(t.calls), t.trainable_turns)
        """
    )
    assert _clean(out), out.stderr
    assert out.stdout.split() == ["1", "1"]
