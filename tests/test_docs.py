"""The docs are true: the site builds with warnings as errors, every code block runs or says it
is a fragment, the pages that list things (Trainer parameters, warnings, errors) list all of
them, and ``arttrace --help`` is plain and complete.

Writing code blocks in README.md and docs/ (the convention these tests enforce)
--------------------------------------------------------------------------------
- A ```` ```python ```` block **runs** in the tests. The blocks of one page run in order, as
  cells of a notebook: one fresh namespace per page, shared by its blocks, with top-level
  ``await`` allowed (async blocks share one event loop per page, so a client made in one block
  works in the next). Each page runs in a temporary working directory, offline, with
  ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` pointing at a fresh ``arttrace.testing`` scripted
  server (it echoes the last user message), so ``AsyncOpenAI()`` reaches it as it would reach
  your vLLM. Keep runnable blocks fast: no real training, no network.
- A block that cannot run here (needs a GPU, a real server, a placeholder like ``...``, a
  shell) is a **fragment**: put ``<!-- fragment: why -->`` on the line (or lines) just before
  its fence. The comment is invisible on GitHub and on the site.
- Output, file trees and logs are ```` ```text ```` blocks; they are neither run nor marked.
- Every fence names its language; any other language (``bash``, ``yaml``, ...) must be a
  fragment.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import inspect
import os
import re
import runpy
import subprocess
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import arttrace as at
from arttrace import _errors
from arttrace.app.cli import build_parser
from arttrace.app.cli import main as cli
from arttrace.capture import _warnings
from arttrace.testing import ScriptedLLM, serve

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("**/*.md")])
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_FRAGMENT = re.compile(r"<!--\s*fragment\b.*?-->")


@dataclass
class Block:
    page: Path
    line: int
    language: str
    code: str
    fragment: bool

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path, text: str | None = None) -> Iterator[Block]:
    """The fenced blocks of a Markdown page (``text``, default: the file's), indented ones
    in lists too, with their first line, language and whether a ``<!-- fragment -->``
    comment precedes them."""
    lines = (page.read_text() if text is None else text).splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, info = match["indent"], match["fence"], match["info"].strip()
        body, j = [], i + 1
        while j < len(lines) and lines[j].strip() != fence:
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        previous = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        language = info.split()[0].lstrip(".{") if info else ""
        yield Block(page, i + 1, language, "\n".join(body) + "\n", bool(_FRAGMENT.search(previous)))
        i = j + 1


ALL_BLOCKS = [b for page in PAGES for b in blocks(page)]
RUNNABLE = {
    page: [b for b in ALL_BLOCKS if b.page == page and b.language == "python" and not b.fragment]
    for page in PAGES
}


def test_the_pages_have_code_blocks_to_check() -> None:
    assert len(PAGES) >= 10 and len(ALL_BLOCKS) > 20
    assert sum(map(len, RUNNABLE.values())) >= 10


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=lambda b: b.where)
def test_every_block_runs_or_is_marked(block: Block) -> None:
    if block.fragment:
        return
    assert block.language, f"{block.where}: name the fence's language (python, text, ...)"
    assert block.language in ("python", "text"), (
        f"{block.where}: a {block.language} block cannot run in the tests: mark it with "
        "<!-- fragment: why --> on the line before its fence"
    )
    if block.language == "python":  # it runs below; here only that it is Python at all
        compile(block.code, block.where, "exec", ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def run_blocks(runnable: list[Block]) -> None:
    """Run a page's blocks in order in one fresh namespace, async ones on one event loop,
    against a fresh scripted server; a failure names the block's page and line."""
    namespace: dict[str, object] = {"__name__": "__docs__"}
    loop = asyncio.new_event_loop()
    saved = {k: os.environ.get(k) for k in ("OPENAI_BASE_URL", "OPENAI_API_KEY")}
    try:
        with serve(ScriptedLLM()) as server, warnings.catch_warnings():
            os.environ.update(OPENAI_BASE_URL=server.base_url, OPENAI_API_KEY="docs-test")
            for block in runnable:
                flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
                code = compile(block.code, block.where, "exec", flags=flags)
                try:
                    if code.co_flags & inspect.CO_COROUTINE:
                        loop.run_until_complete(eval(code, namespace))
                    else:
                        exec(code, namespace)
                except Exception as error:
                    raise AssertionError(f"{block.where} failed: {error!r}") from error
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
        at.uninstrument()
        _warnings.reset()


@pytest.mark.parametrize(
    "page",
    [p for p in PAGES if RUNNABLE[p]],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_runnable_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    run_blocks(RUNNABLE[page])


def test_the_checks_catch_a_broken_block_and_honour_markers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The harness itself: markers, indented fences, a shared namespace, failures named."""
    page = ROOT / "docs" / "_harness_check.md"  # a name only: the file is not written
    text = (
        "<!-- fragment: placeholder -->\n```python\nsolve(...)\n```\n\n"
        "- a list item\n\n  ```python\n  x = await_me = 1\n  ```\n\n"
        "```python\nimport asyncio\nawait asyncio.sleep(0)\ny = x + 1\n```\n\n"
        "```python\nassert y == 3, 'wrong'\n```\n"
    )
    found = list(blocks(page, text))
    assert [(b.line, b.fragment) for b in found] == [
        (2, True),
        (8, False),
        (12, False),
        (18, False),
    ]
    assert found[1].code == "x = await_me = 1\n"  # dedented out of the list item
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        AssertionError, match=r"_harness_check.md:18 failed: AssertionError\('wrong'"
    ):
        run_blocks([b for b in found if not b.fragment])


OFFLINE_EXAMPLES = [
    "quickstart.py",
    "langchain_agent.py",
    "llama_index_agent.py",
    "google_adk_agent.py",
]
"""The scripts the README and the framework pages say run offline, as they are."""


@pytest.mark.parametrize("script", OFFLINE_EXAMPLES)
def test_examples_run(script: str, capsys: pytest.CaptureFixture[str]) -> None:
    """In-process: ART and the frameworks are imported once per test session, not per script."""
    try:
        runpy.run_path(str(ROOT / "examples" / script), run_name="__main__")
    finally:
        at.uninstrument()
        _warnings.reset()
    assert "Choice" in capsys.readouterr().out  # each prints the ART form of what it captured


# -- pages that list things list all of them ------------------------------------------------


def _page(name: str) -> str:
    return (ROOT / "docs" / name).read_text()


def test_troubleshooting_names_every_warning_cause_and_error() -> None:
    page = _page("troubleshooting.md")
    reasons = [r for r in _warnings._FIXES if f"`{r}`" not in page]
    assert reasons == [], "docs/troubleshooting.md lacks these UntrainableTurnWarning causes"
    errors = [
        name
        for name, value in vars(_errors).items()
        if isinstance(value, type)
        and issubclass(value, _errors.ArttraceError)
        and f"`{name}`" not in page
    ]
    assert errors == [], "docs/troubleshooting.md lacks these errors"


# -- the site ------------------------------------------------------------------------------


def test_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "reference" / "index.html").exists()
    # The Trainer's parameters are rendered from its docstring: each one is documented there.
    training = (tmp_path / "training" / "index.html").read_text()
    undocumented = [
        name
        for name in inspect.signature(at.Trainer).parameters
        if not re.search(rf"<code>(\*\*)?{name}</code>", training)
    ]
    assert undocumented == [], "document these in the Trainer's docstring (Args:)"


# -- the command line ----------------------------------------------------------------------


def _help(*args: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        cli([*args, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_cli_help_is_plain_text_with_every_option_explained(
    capsys: pytest.CaptureFixture[str],
) -> None:
    top = _help(capsys=capsys)
    assert "--version" in top and "demo" in top
    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for name, command in commands.choices.items():
        shown = _help(name, capsys=capsys)
        for text in (top, shown):  # plain text, not reST
            assert not re.search(r"``|:\w+:`", text), text
        for action in command._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            if isinstance(action, argparse._HelpAction):
                continue
            option = action.option_strings[0]
            words = (action.help or "").split()
            assert len(words) >= 2, f"arttrace {name} {option} has no help text"
            listed = shown.split("\noptions:\n", 1)[1]
            entry = re.split(rf"^  {re.escape(option)}\b", listed, flags=re.M)[1]
            entry = entry.split("\n  -", 1)[0]
            assert "(default:" in entry, f"arttrace {name} {option} shows no default:\n{shown}"
    demo = _help("demo", capsys=capsys)
    assert {"--out", "--examples", "--rollouts", "--steps", "--seed"} <= set(
        re.findall(r"^  (--[\w-]+)", demo, flags=re.M)
    )


def test_cli_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"arttrace {at.__version__}"
