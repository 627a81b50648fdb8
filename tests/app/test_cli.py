"""The ``arttrace`` command and ``make`` as a new user meets them: run as processes, under a
terminal where it matters. A bad argument is one error line with its fix and exit status 2,
before anything heavy (ART, torch, transformers) is imported; the demo talks from its first
second; ``make`` without Python 3.12 or newer says so in one line."""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from arttrace.testing import serve

ROOT = Path(__file__).resolve().parents[2]
ARTTRACE = [sys.executable, "-m", "arttrace.app.cli"]
HEAVY = ("art", "torch", "transformers")


def arttrace(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ARTTRACE, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


@pytest.fixture
def light(tmp_path: Path) -> dict[str, str]:
    """An environment in which importing ART, torch or transformers fails loudly: what passes
    in it never loaded them."""
    fakes = tmp_path / "heavy"
    for name in HEAVY:
        (fakes / name).mkdir(parents=True)
        (fakes / name / "__init__.py").write_text(f"raise ImportError('test: {name} imported')\n")
    return {**os.environ, "PYTHONPATH": str(fakes)}


def one_error(result: subprocess.CompletedProcess[str], usage: str, message: str) -> None:
    """Exit status 2, the command's usage, and one error line that holds ``message``."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "imported" not in result.stderr, result.stderr
    assert f"\nusage: {usage} " in f"\n{result.stderr}", result.stderr
    errors = [line for line in result.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1 and message in errors[0], result.stderr
    assert errors[0].startswith(f"{usage}: error: ")


# -- the top-level command -----------------------------------------------------------------


def test_an_unknown_option_is_named_and_the_commands_listed(light):
    result = arttrace("--bogus", env=light)
    one_error(result, "arttrace", "unrecognized arguments: --bogus")
    assert "required" not in result.stderr
    assert "demo" in result.stderr.splitlines()[-1] and "gateway" in result.stderr.splitlines()[-1]


def test_no_command_lists_the_commands(light):
    result = arttrace(env=light)
    one_error(result, "arttrace", "a COMMAND is required")
    assert "demo" in result.stderr.splitlines()[-1] and "gateway" in result.stderr.splitlines()[-1]


def test_an_unknown_option_of_a_command_prints_that_commands_usage(light):
    one_error(arttrace("demo", "--bogus", env=light), "arttrace demo", "unrecognized arguments")
    one_error(arttrace("demo", "--steps", "x", env=light), "arttrace demo", "invalid int value")


def test_help_shows_the_real_defaults():
    from arttrace.app._greeter_demo import CPUSettings

    for args in ((), ("demo",), ("gateway",)):
        result = arttrace(*args, "--help")
        assert result.returncode == 0 and "None" not in result.stdout, result.stdout
    shown = " ".join(arttrace("demo", "--help").stdout.split())
    cpu = CPUSettings()
    assert "(default: cpu;" in shown and "(default: runs/demo)" in shown
    assert f"(default: cpu {cpu.examples}, dry-run 4)" in shown
    assert f"(default: cpu {cpu.rollouts}, dry-run 4)" in shown
    assert f"(default: cpu {cpu.steps}, dry-run 2)" in shown


# -- arttrace demo: each bad argument, before ART loads ------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--model", "x"), "--base-url and --model go together"),
        (("--base-url", "http://127.0.0.1:9/v1"), "--base-url and --model go together"),
        (("--backend", "cpu", "--base-url", "http://x/v1", "--model", "m"), "serves its own"),
        (("--examples", "0"), "must be at least 1"),
        (("--backend", "gpu"), "invalid choice: 'gpu'"),
    ],
)
def test_bad_demo_flags_are_refused_before_art_loads(light, tmp_path, args, message):
    one_error(
        arttrace("demo", "--out", str(tmp_path / "d"), *args, env=light), "arttrace demo", message
    )


def test_an_occupied_or_unusable_out_is_refused_before_art_loads(light, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    result = arttrace("demo", "--out", str(mine), env=light)
    one_error(result, "arttrace demo", "choose another --out")
    assert (mine / "notes.txt").read_text() == "keep me"
    result = arttrace("demo", "--out", str(mine / "notes.txt"), env=light)
    one_error(result, "arttrace demo", "is a file")
    result = arttrace("demo", "--out", str(mine / "notes.txt" / "demo"), env=light)
    one_error(result, "arttrace demo", "is a file")


def test_an_unreachable_server_is_refused_before_art_loads(light, tmp_path):
    with serve() as server:
        url = server.base_url  # a port that was free a moment ago, and is closed now
    result = arttrace(
        "demo", "--base-url", url, "--model", "m", "--out", str(tmp_path / "d"), env=light
    )
    one_error(result, "arttrace demo", f"cannot reach {url}")
    assert "vllm serve" in result.stderr


def test_a_missing_cpu_extra_is_named_before_art_loads(light, tmp_path):
    """As if torch were not installed: the demo's default backend names the extra to install."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None\n")
    env = {**light, "PYTHONPATH": f"{hide}{os.pathsep}{light['PYTHONPATH']}"}
    result = arttrace("demo", "--out", str(tmp_path / "d"), env=env)
    one_error(result, "arttrace demo", "pip install 'arttrace[cpu]'")
    assert "torch" in result.stderr and "--backend dry-run" in result.stderr
    assert not (tmp_path / "d").exists()


# -- arttrace demo under a terminal --------------------------------------------------------


def in_terminal(args: list[str], timeout: float) -> tuple[int, list[tuple[float, str]]]:
    """Run ``args`` with a pseudo-terminal (100 columns, as a window has) as stdin, stdout and
    stderr; the exit status and what it wrote, each piece with the seconds since start."""
    leader, follower = os.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # rows, columns
    started = time.monotonic()
    process = subprocess.Popen(
        args, stdin=follower, stdout=follower, stderr=follower, start_new_session=True
    )
    os.close(follower)
    pieces: list[tuple[float, str]] = []
    try:
        while time.monotonic() - started < timeout:
            ready, _, _ = select.select([leader], [], [], 1.0)
            if not ready:
                if process.poll() is not None:
                    break
                continue
            try:
                data = os.read(leader, 65536)
            except OSError:  # EIO: the process has exited and closed the terminal
                break
            if not data:
                break
            pieces.append((time.monotonic() - started, data.decode(errors="replace")))
        return process.wait(timeout=max(1.0, timeout - (time.monotonic() - started))), pieces
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(leader)


def test_the_demo_talks_from_its_first_second_under_a_terminal(tmp_path):
    """What a new user sees: a first line at once, long before ART has loaded (about 30 s on
    2 cores); then warm-up, validation, each step's line (reward, loss), a progress bar for
    each step's runs, and the summary, where "loss last" names its step."""
    out = tmp_path / "demo"
    code, pieces = in_terminal(
        [
            *ARTTRACE,
            "demo",
            "--out",
            str(out),
            "--examples",
            "2",
            "--rollouts",
            "4",
            "--steps",
            "2",
        ],
        timeout=600,
    )
    text = "".join(p for _, p in pieces)
    assert code == 0, text
    first_at, first = pieces[0]
    assert first.startswith("arttrace demo: ") and "ART loaded" not in first
    assert text.index("loading ART") < text.index("ART loaded") < text.index("warm-up")
    assert first_at < 15, pieces[:3]  # 5 s asked; generous for a loaded machine
    assert "val step 0: reward" in text and "val step 2: reward" in text
    for step in (0, 1):
        line = next(x for x in text.splitlines() if x.startswith(f"train step {step}: reward"))
        assert "shipped" in line, line
    assert "run/s" in text  # the progress bar over a step's runs
    losses = [
        (int(m["step"]), m["train/loss"])
        for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
        if "train/loss" in m
    ]
    loss_last = next(x for x in text.splitlines() if x.strip().startswith("loss last"))
    assert loss_last.endswith(f"{losses[-1][1]:.3f} (step {losses[-1][0]})"), loss_last


# -- make ----------------------------------------------------------------------------------


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """The Makefile alone in a folder: ``make -n`` there prints what it would run, and a
    failed Python check stops it before anything runs."""
    (tmp_path / "clone").mkdir()
    shutil.copy(ROOT / "Makefile", tmp_path / "clone" / "Makefile")
    (tmp_path / "bin").mkdir()
    return tmp_path / "clone"


def make(clone: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``make`` with only ``clone/../bin`` on PATH (no pyenv, no system Python)."""
    env = {"PATH": str(clone.parent / "bin"), "HOME": str(clone.parent)}
    return subprocess.run(
        [shutil.which("make") or "make", "--no-print-directory", "-C", str(clone), *args],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip


def python_named(clone: Path, name: str, real: str | None) -> Path:
    """``bin/name``: a real interpreter (``real``), or one that fails every check (``None``)."""
    path = clone.parent / "bin" / name
    if real is None:
        path.write_text("#!/bin/sh\nexit 1\n")
        path.chmod(0o755)
    else:
        path.symlink_to(real)
    return path


REAL = os.path.realpath(sys._base_executable)  # the Python 3.12+ behind the venv


def test_make_without_python_3_12_says_so_in_one_line(clone):
    python_named(clone, "python3", None)  # an older python3 is passed over
    result = make(clone, "-n", ".tools/bin/uv")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Python 3.12 or newer not found" in output and "pyenv install" in output, output
    assert len(output.strip().splitlines()) == 1, output
    assert not (clone / ".tools").exists()


@pytest.mark.parametrize("name", ["python3.12", "python3.13", "python3.14", "python3"])
def test_make_finds_python_3_12_or_newer(clone, name):
    python = python_named(clone, name, REAL)
    result = make(clone, "-n", ".tools/bin/uv")
    assert result.returncode == 0, result.stderr
    assert f"{python} -m venv .tools" in result.stdout, result.stdout


def test_make_refuses_a_given_python_older_than_3_12(clone):
    old = python_named(clone, "python3.11", None)
    result = make(clone, "-n", ".tools/bin/uv", f"PYTHON={old}")
    output = result.stdout + result.stderr
    assert result.returncode != 0 and f"{old} is not Python 3.12 or newer" in output, output
    assert len(output.strip().splitlines()) == 1, output


def test_make_finds_python_3_13_through_pyenv(clone):
    """pyenv's shims are not on PATH here; ``pyenv which`` knows only 3.13."""
    pyenv = clone.parent / "bin" / "pyenv"
    pyenv.write_text(
        f'#!/bin/sh\n[ "$PYENV_VERSION" = 3.13 ] && [ "$2" = python3.13 ] && echo {REAL}\n'
    )
    pyenv.chmod(0o755)
    result = make(clone, "-n", ".tools/bin/uv")
    assert result.returncode == 0, result.stderr
    assert f"{REAL} -m venv .tools" in result.stdout, result.stdout
