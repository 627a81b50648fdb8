"""The docs are true: the site builds with warnings as errors, every code block runs or says it
is a fragment, the pages that list things (Trainer parameters, warnings, errors) list all of
them, and ``arttrace --help`` is plain and complete.

Writing code blocks in README.md and docs/ (the convention these tests enforce)
--------------------------------------------------------------------------------
- A ```` ```python ```` block is a **script**: the tests write it to a file and run it as
  ``python FILE`` runs it (``__name__ == "__main__"``, its folder first on ``sys.path``), so
  it says every import and has no top-level ``await``: async code goes in ``async def
  main()`` and ``asyncio.run(main())``. A first line ``# name.py`` names the file; a later
  block of the same page may import from it (``from quickstart import solve``), as a script
  saved next to it would, so a script that others import runs its ``main()`` under ``if
  __name__ == "__main__":``. A page's blocks run in order in one temporary working directory,
  offline, with ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` pointing at a fresh
  ``arttrace serve-test-model`` server (:func:`arttrace.app.serve_test_model.quiz_model`:
  it knows a few capitals and sums and gets each right every other time, else it echoes), so
  ``AsyncOpenAI()`` reaches it as it would reach your vLLM. Keep runnable blocks fast: no
  real training, no network.
- A block that cannot run here (needs a GPU, a real server, a placeholder like ``...``, a
  shell) is a **fragment**: put ``<!-- fragment: why -->`` on the line (or lines) just before
  its fence. The comment is invisible on GitHub and on the site.
- Output, file trees and logs are ```` ```text ```` blocks; they are neither run nor marked.
- Every fence names its language; any other language (``bash``, ``yaml``, ...) must be a
  fragment.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import re
import runpy
import signal
import socket
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
from arttrace.app.serve_test_model import quiz_model
from arttrace.capture import _warnings
from arttrace.testing import serve

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("**/*.md")])
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_FRAGMENT = re.compile(r"<!--\s*fragment\b.*?-->")
_SCRIPT_NAME = re.compile(r"\A#\s*(?P<name>[A-Za-z_]\w*\.py)\b")


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

    @property
    def script(self) -> str:
        """The file it runs as: the name its first line gives (``# quickstart.py``), or one
        made of its page and line."""
        named = _SCRIPT_NAME.match(self.code)
        return named["name"] if named else f"{self.page.stem.replace('-', '_')}_{self.line}.py"


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
    if block.language == "python":  # it runs below; here only that it is a script at all
        try:  # to bytecode: the parser alone accepts a top-level await
            compile(block.code, block.where, "exec", dont_inherit=True)
        except SyntaxError as error:
            hint = (
                ": top-level await does not run in a .py file; put the async code in "
                "`async def main()` and end with `asyncio.run(main())`"
                if "outside" in str(error.msg) and "function" in str(error.msg)
                else ""
            )
            raise AssertionError(f"{block.where}: {error.msg}{hint}") from None


def run_blocks(runnable: list[Block], folder: Path, *, warns: str | None = None) -> None:
    """Write a page's blocks to files in ``folder`` (the working directory) and run each, in
    order, as ``python FILE`` would (in this process, so ART is imported once per session):
    top-level ``await`` is a SyntaxError, as in a file. ``OPENAI_BASE_URL`` points at a fresh
    test-model server; a failure names the block's page and line. arttrace's own warnings are
    asserted: the page's example gives the one ``warns`` names (its page explains it), or
    none."""
    saved = {k: os.environ.get(k) for k in ("OPENAI_BASE_URL", "OPENAI_API_KEY")}
    path = list(sys.path)
    try:
        with serve(quiz_model()) as server, warnings.catch_warnings(record=True) as caught:
            os.environ.update(OPENAI_BASE_URL=server.base_url, OPENAI_API_KEY="docs-test")
            sys.path.insert(0, str(folder))
            for block in runnable:
                script = folder / block.script
                script.write_text(block.code)
                try:
                    runpy.run_path(str(script), run_name="__main__")
                except (Exception, SystemExit) as error:
                    raise AssertionError(f"{block.where} failed: {error!r}") from error
                finally:
                    _forget(folder)  # each script starts afresh, as in its own process
        _expect_warnings(caught, warns, runnable[0].where if runnable else "")
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        sys.path[:] = path
        at.uninstrument()
        _warnings.reset()
        _exit_as_a_process_would()


def _exit_as_a_process_would() -> None:
    """Collect what the scripts left behind, as their process's exit would. A script's
    module-level client (``client = AsyncOpenAI()``, as the pages write it) keeps its pooled
    connections after ``asyncio.run`` closes the loop; run as a file, the process then exits.
    Run here, they would be collected during a later test, an "unclosed transport"
    ResourceWarning under that test's name."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "unclosed", ResourceWarning)
        gc.collect()


def _expect_warnings(caught: list[warnings.WarningMessage], warns: str | None, where: str) -> None:
    """Fail on an arttrace warning the page does not expect (and on a missing expected one);
    give every other warning back to pytest's summary."""
    ours = [str(w.message) for w in caught if w.category.__module__.startswith("arttrace")]
    if warns is None:
        assert ours == [], f"{where}: the example warns: {ours}"
    else:
        assert any(warns in text for text in ours), f"{where}: expected a warning {warns!r}"
        assert all(warns in text for text in ours), f"{where}: unexpected warnings: {ours}"
    for w in caught:
        if not w.category.__module__.startswith("arttrace"):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


WARNS = {"docs/openai_agents.md": "only a function call"}
"""Pages whose example warns on purpose (the page says why), and what the warning says."""


def _forget(folder: Path) -> None:
    """Unload the modules imported from ``folder`` (a script imported by the next one)."""
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(folder)):
            del sys.modules[name]


SHIPS = {
    "README.md": "runs/quickstart",
    "docs/getting-started.md": "runs/first",
    "docs/training.md": "runs/agent-001",
    "docs/backends.md": "runs/check",
}
"""Pages whose training example must really ship a step (a group whose rewards differ), not
train nothing on flat groups: the Trainer's output folder each one writes."""


@pytest.mark.parametrize(
    "page",
    [p for p in PAGES if RUNNABLE[p]],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_runnable_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    where = str(page.relative_to(ROOT))
    run_blocks(RUNNABLE[page], tmp_path, warns=WARNS.get(where))
    if where in SHIPS:
        first = json.loads((tmp_path / SHIPS[where] / "metrics.jsonl").read_text().splitlines()[0])
        assert first["groups_kept"] >= 1, f"{where}: its training step ships nothing: {first}"


def test_the_checks_catch_a_broken_block_and_honour_markers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The harness itself: markers, indented fences, named scripts importing each other,
    failures named, and top-level ``await`` refused as a file refuses it."""
    page = ROOT / "docs" / "_harness_check.md"  # a name only: the file is not written
    text = (
        "<!-- fragment: placeholder -->\n```python\nsolve(...)\n```\n\n"
        "- a list item\n\n  ```python\n  # first.py\n  x = 1\n  ```\n\n"
        "```python\nimport asyncio\nfrom first import x\nasync def main() -> None:\n"
        "    await asyncio.sleep(0)\nasyncio.run(main())\nassert x + 1 == 3, 'wrong'\n```\n\n"
        "```python\nimport asyncio\nawait asyncio.sleep(0)\n```\n"
    )
    found = list(blocks(page, text))
    assert [(b.line, b.fragment, b.script) for b in found] == [
        (2, True, "_harness_check_2.py"),
        (8, False, "first.py"),
        (13, False, "_harness_check_13.py"),
        (22, False, "_harness_check_22.py"),
    ]
    assert found[1].code == "# first.py\nx = 1\n"  # dedented out of the list item
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        AssertionError, match=r"_harness_check.md:13 failed: AssertionError\('wrong'"
    ):
        run_blocks(found[1:3], tmp_path)
    assert "first" not in sys.modules  # a page's scripts are forgotten after it
    with pytest.raises(AssertionError, match=r"_harness_check.md:22: .*asyncio.run\(main\(\)\)"):
        test_every_block_runs_or_is_marked(found[3])
    with pytest.raises(AssertionError, match=r"_harness_check.md:22 failed: SyntaxError"):
        run_blocks(found[3:], tmp_path)


# -- arttrace serve-test-model: what the snippets talk to --------------------------------


def _arttrace(*args: str) -> list[str]:
    """The installed ``arttrace`` command, as a reader runs it."""
    script = Path(sys.executable).with_name("arttrace")
    return [str(script), *args] if script.exists() else [sys.executable, "-m", "arttrace.app.cli"]


def test_the_readme_quickstart_runs_against_serve_test_model(tmp_path: Path) -> None:
    """A new user's path: start ``arttrace serve-test-model``, export the URL it prints,
    run the README's first block with ``python``; Ctrl-C stops the server."""
    server = subprocess.Popen(
        _arttrace("serve-test-model", "--port", "0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        first = server.stdout.readline()
        found = re.search(r"serving on (http://127\.0\.0\.1:\d+/v1) \(Ctrl-C stops it\)", first)
        assert found, first
        assert f"export OPENAI_BASE_URL={found[1]}" in server.stdout.readline()
        (quickstart,) = [b for b in RUNNABLE[ROOT / "README.md"] if b.script == "quickstart.py"]
        (tmp_path / "quickstart.py").write_text(quickstart.code)
        done = subprocess.run(
            [sys.executable, "quickstart.py"],
            cwd=tmp_path,
            env={**os.environ, "OPENAI_BASE_URL": found[1], "OPENAI_API_KEY": "test"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["1.0", "1"], done.stdout  # reward, trainable turns
    finally:
        server.send_signal(signal.SIGINT)
        out, err = server.communicate(timeout=30)
    assert (server.returncode, out.strip(), err) == (0, "arttrace serve-test-model: stopped", "")


def test_serve_test_model_refuses_a_bad_port_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for bad, says in [
            (
                str(port),
                f"cannot listen on 127.0.0.1:{port} (Address already in use): pick "
                "another --port (0: any free port)",
            ),
            ("70000", "argument --port: must be 0 to 65535 (0: any free port), got 70000"),
        ]:
            with pytest.raises(SystemExit) as exit_:
                cli(["serve-test-model", "--port", bad])
            assert exit_.value.code == 2
            err = capsys.readouterr().err.splitlines()
            assert err == [
                "usage: arttrace serve-test-model [-h] [--port PORT]",
                f"arttrace serve-test-model: error: {says}",
            ]


def test_the_test_model_gives_a_group_rewards_that_differ() -> None:
    """Each known question is right every other ask, whatever order the asks come in;
    anything else is echoed."""
    llm = quiz_model()

    def answers(content: str, n: int = 1) -> list[str]:
        ask = {"model": "m", "n": n, "messages": [{"role": "user", "content": content}]}
        status, body, _ = llm.respond(ask)
        assert status == 200 and body is not None
        return [choice["message"]["content"] for choice in body["choices"]]

    paris, lyon = "The capital of France is Paris.", "The capital of France is Lyon."
    assert [answers("Capital of France?") for _ in range(3)] == [[paris], [lyon], [paris]]
    assert answers("What is the  capital of france?", n=2) == [lyon, paris]  # the same question
    assert answers("What is 2 + 2?") + answers("What is 2 + 2?") == [
        "The answer is 4.",
        "The answer is 5.",
    ]
    assert answers("hi") == ["You said: hi"]


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
        _exit_as_a_process_would()
    assert "Choice" in capsys.readouterr().out  # each prints the ART form of what it captured


def test_my_agent_cpu_trains_for_real(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``examples/my_agent_cpu.py 1``: one GRPO step on CPUBackend that ships its groups,
    then one more from the checkpoint and journal the first run left (its resume)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["my_agent_cpu.py", "1"])
    try:
        for _ in range(2):
            runpy.run_path(str(ROOT / "examples" / "my_agent_cpu.py"), run_name="__main__")
    finally:
        at.uninstrument()
        _warnings.reset()
        _exit_as_a_process_would()
    steps = re.findall(
        r"^step (\d+): reward [\d.]+, (\d+) groups shipped, loss -?\d",
        capsys.readouterr().out,
        re.M,
    )
    assert steps == [("0", "2"), ("1", "2")]


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
    """Plain ``mkdocs build`` (as ``mkdocs serve``), without ``make docs``'s environment."""
    env = {k: v for k, v in os.environ.items() if k != "NO_MKDOCS_2_WARNING"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert "end of life" not in done.stderr, "mkdocs.yml no longer quiets the theme's banner"
    assert (tmp_path / "reference" / "index.html").exists()
    # The Trainer's parameters are rendered from its docstring: each one is documented there.
    training = (tmp_path / "training" / "index.html").read_text()
    undocumented = [
        p.name
        for p in inspect.signature(at.Trainer).parameters.values()
        if p.kind is not p.VAR_KEYWORD  # **unexpected: a TypeError naming the keyword
        and not re.search(rf"<code>{p.name}</code>", training)
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
            if not action.required:  # a required option has no default to show
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
