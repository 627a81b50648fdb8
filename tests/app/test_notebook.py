"""examples/quickstart.ipynb, executed cell by cell in a real Jupyter kernel (ipykernel running
this venv's Python, driven by nbclient as Jupyter's own ``nbconvert --execute`` drives it).

What a notebook user does is what the test does: top-level ``await`` of the quick start and of
``trainer.train`` on the CPU backend, ``instrument()`` run again, the viewer started from a
cell, and a kernel interrupt (SIGINT, what the ■ button sends) in the middle of a training
cell, after which the next cell resumes the run from its journal. Nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).parents[2]
NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"
WIDGET = "application/vnd.jupyter.widget-view+json"
STEP_RUNS = 8
"""Runs per step in the notebook: group_size 4 x groups_per_step 2."""


def test_the_committed_notebook_has_no_outputs() -> None:
    """Outputs, execution counts and widget state are stripped before committing (they
    would hold one machine's paths, ports and timings, and make every diff noisy)."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code
    assert [(i, c.outputs) for i, c in enumerate(code) if c.outputs] == []
    assert [c.execution_count for c in code] == [None] * len(code)
    assert "widgets" not in nb.metadata


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A kernel spec for this interpreter, in a Jupyter path of the test's own (the user's
    kernels, IPython profile and startup files are not used)."""
    spec = tmp_path / "jupyter" / "kernels" / "arttrace-test"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "arttrace tests", "language": "python"})
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)  # model.log stays local
    return "arttrace-test"


def _client(nb: Any, kernel: str, folder: Path) -> NotebookClient:
    return NotebookClient(
        nb, kernel_name=kernel, timeout=600, resources={"metadata": {"path": str(folder)}}
    )


def _text(cell: Any, name: str | None = None) -> str:
    """A cell's stream output (``name``: stdout or stderr only), and its plain-text values."""
    parts = []
    for out in cell.outputs:
        if out.output_type == "stream" and name in (None, out.name):
            parts.append(out.text)
        elif name is None and out.output_type in ("execute_result", "display_data"):
            parts.append(out.data.get("text/plain", ""))
    return "".join(parts)


def _journaled(run: Path, step: int) -> int:
    path = run / "journal" / f"step-{step:05d}" / "rollouts.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


async def _until(condition: Callable[[], bool], what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        await asyncio.sleep(0.02)


async def _interrupted(
    client: NotebookClient, cell: Any, index: int, ready: Callable[[], bool]
) -> str:
    """Run ``cell`` and, once ``ready()``, interrupt the kernel (SIGINT, what Jupyter's ■
    button sends); the error the cell stopped with."""
    executing = asyncio.ensure_future(client.async_execute_cell(cell, index))
    await _until(lambda: ready() or executing.done(), "the moment to interrupt")
    assert not executing.done(), _text(cell)
    await client.km.interrupt_kernel()
    with pytest.raises(CellExecutionError) as stopped:
        await executing
    return re.sub(r"\x1b\[[0-9;]*m", "", str(stopped.value))  # IPython colours tracebacks


async def test_the_notebook_runs_in_a_kernel_and_resumes_after_an_interrupt(
    tmp_path: Path, kernel: str
) -> None:
    """Every cell, in order, in one kernel. The interrupt cell is interrupted while a step's
    runs go on; the resume cell once while the backend trains a step (the groups must not
    train twice), then run again to the end."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    run = tmp_path / "runs" / "notebook"
    client = _client(nb, kernel, tmp_path)
    cells = {cell.id: cell for cell in nb.cells}

    def completed() -> int:
        return int(json.loads((run / "state.json").read_text())["completed_steps"])

    def step_file(name: str) -> Path:
        return run / "journal" / f"step-{completed():05d}" / name

    async with client.async_setup_kernel():
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            if cell.id == "interrupt":  # while the step's runs go on
                error = await _interrupted(
                    client, cell, index, lambda: _journaled(run, completed()) >= 1
                )
                assert "CancelledError" in error
                interrupted_at = completed()
                journaled = step_file("rollouts.jsonl")
                before = journaled.read_bytes()
                assert before.count(b"\n") >= 1
            elif cell.id == "resume":  # while the backend trains a step, then to the end

                def training() -> bool:
                    shipping, shipped = step_file("shipping.json"), step_file("shipped.json")
                    return shipping.exists() and not shipped.exists()

                error = await _interrupted(client, cell, index, training)
                assert "CancelledError" in error
                assert "in CPUBackend.train" in error, error  # it landed in the backend's step
                await client.async_execute_cell(cell, index)
            else:
                await client.async_execute_cell(cell, index)  # an error fails the test here
        # What the backend trained, asked of the kernel the notebook ran in.
        probe = nbformat.v4.new_code_cell("print(await backend._get_step(model))")
        nb.cells.append(probe)
        await client.async_execute_cell(probe, len(nb.cells) - 1)
    nbformat.write(nb, tmp_path / "executed.ipynb")  # to read when an assertion fails

    # Every cell ran; outputs hold no error and no tqdm warning.
    outputs = [out for cell in nb.cells for out in cell.get("outputs", [])]
    errors = [out for out in outputs if out.output_type == "error"]
    assert [e.ename for e in errors] == ["CancelledError"]  # the interrupt's, and only it
    everything = "".join(_text(cell) for cell in nb.cells if cell.cell_type == "code")
    assert "TqdmWarning" not in everything and "IProgress" not in everything
    assert "arttrace failed" not in everything  # no internal error logged

    # The quick start captured four runs; instrument() twice recorded the call once.
    assert re.search(r"rewards \[1\.0, 0\.0, 1\.0, 0\.0\]", _text(cells["quick-start"]))
    assert "one call recorded 1 time(s)" in _text(cells["instrument-again"])

    # Training: each step's progress bar is a widget (ipywidgets is in the test set), and
    # each step said what it did on stderr.
    train = cells["train"]
    bars = [out for out in train.outputs if out.output_type == "display_data"]
    assert bars and all(WIDGET in out.data for out in bars), train.outputs
    assert [b.data["text/plain"][:13] for b in bars] == ["train step 0:", "train step 1:"]
    assert re.findall(r"^train step (\d+): reward", _text(train, "stderr"), re.M) == ["0", "1"]

    # The viewer: a link, and it answered while the kernel ran.
    shown = cells["view"].outputs[0].data
    url = re.search(r'href="(http://127\.0\.0\.1:\d+/)"', shown["text/html"])
    assert url and shown["text/plain"] == f"<arttrace view: {url[1]}>"

    # The interrupt left a journal that the next cell resumed: the interrupted step's runs
    # that had finished were kept (not run again), and the run reached its target.
    resumed = _text(cells["resume"], "stdout")
    match = re.search(r"resuming at step (\d+) of (\d+)", resumed)
    assert match and int(match[1]) == interrupted_at < int(match[2]) == 5, resumed
    assert "5 steps completed" in resumed
    # The step whose training was interrupted was not trained again: its thread went on,
    # and the resumed Trainer asked the backend.
    assert "they are not shipped again" in _text(cells["resume"], "stderr")
    after = journaled.read_bytes()
    assert after.startswith(before) and after.count(b"\n") == STEP_RUNS
    for step in range(5):
        assert _journaled(run, step) == STEP_RUNS
        assert (run / "journal" / f"step-{step:05d}" / "shipped.json").exists()
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1, 2, 3, 4]
    # The backend trained as many steps as the run completed.
    assert _text(probe, "stdout").strip() == "5"
    with pytest.raises(OSError):  # the last cell stopped the viewer
        urllib.request.urlopen(url[1], timeout=5)


async def test_progress_is_text_without_ipywidgets_and_warns_nothing(
    tmp_path: Path, kernel: str
) -> None:
    """A kernel without ipywidgets (the notebook extra not installed) draws the text bar,
    and prints no ``TqdmWarning: IProgress not found`` (``tqdm.auto`` would)."""
    code = [
        "import sys\nsys.modules['ipywidgets'] = None  # as if it were not installed",
        "from arttrace.training._report import Progress\n"
        "bar = Progress('train step 0', 3, [], enabled=True)\n"
        "for reward in (1.0, 0.0, 1.0):\n"
        "    bar.update(reward)\n"
        "bar.close()",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in code])
    await _client(nb, kernel, tmp_path).async_execute()
    bar = nb.cells[1]
    assert {(out.output_type, out.get("name")) for out in bar.outputs} == {("stream", "stderr")}
    assert "\rtrain step 0:   0%|" in _text(bar)  # the text bar, redrawn in place
    assert "Warning" not in _text(bar)
