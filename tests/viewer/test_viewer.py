"""``arttrace view``: the web app over run folders, driven in a real headless Chromium.

The runs are real: the demo's (``arttrace demo --backend dry-run``), and a Trainer run of a
calculator agent on scripted OpenAI-protocol servers (tests/served's kind, over loopback HTTP)
whose runs hold what the viewer must show: tool calls, a sub-agent's conversation (context),
an example served without logprobs (untrainable), a run that raised, validation. The
calculator's servers render with the offline Qwen2.5 tokenizer, so its runs hold Qwen2.5's
token ids, which the viewer turns back into text with that tokenizer; a short CPU demo (the
default ``arttrace demo``) saves its own tokenizer, which the viewer finds by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import arttrace as at
from arttrace.capture import _warnings
from arttrace.testing import HFChatTokenizer, Reply, ScriptedLLM, ToolCall, serve
from arttrace.viewer import Viewer
from arttrace.viewer._runs import problem_of
from support.browser import Screenshots, chromium
from support.qwen import qwen_tokenizer

LIVE_SECONDS = 2.0
"""A line appended to a journal is on the page within this."""
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]
UNTRAINABLE = "q-2"
"""The example whose policy calls go to a server that sends no logprobs."""


# -- the runs ---------------------------------------------------------------------------------


def calculator_model(**options: Any) -> ScriptedLLM:
    """Calls ``add``, then reports the tool's result. Every third first call for a question
    adds 1 to ``b`` (so each group of three gets one wrong answer, whatever order its runs
    reach the server in), except for small numbers (validation's questions); ``summariser``
    calls get a one-line summary."""
    asked: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def respond(request: dict[str, Any]) -> Reply:
        last = request["messages"][-1]
        if request["model"] == "summariser":
            return Reply(f"In short: {last['content'][:60]}")
        if last["role"] == "tool":
            return Reply(f"The answer is {last['content']}.")
        a, b = (int(x) for x in last["content"].removeprefix("What is ").rstrip("?").split("+"))
        with lock:
            asked[last["content"]] += 1
            wrong = asked[last["content"]] % 3 == 2 and a >= 10  # validation's: always right
        return Reply(tool_calls=[ToolCall("add", {"a": a, "b": b + wrong})])

    return ScriptedLLM(respond, tokenizer=HFChatTokenizer(qwen_tokenizer()), **options)


def calculator(client: Any) -> Any:
    @at.trainable
    async def solve(question: str) -> str:
        messages: list[Any] = [
            {"role": "system", "content": "You are a calculator. Use the add tool."},
            {"role": "user", "content": question},
        ]
        while True:
            response = await client.chat.completions.create(
                model="policy", messages=messages, tools=TOOLS
            )
            message = response.choices[0].message
            messages.append(message)
            if not message.tool_calls:
                return str(message.content or "")
            for call in message.tool_calls:
                args = json.loads(call.function.arguments)
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])}
                )

    return solve


async def train_calculator(out: Path) -> None:
    """Two steps of three groups of three runs on DryRunBackend, validation before and after."""
    import art
    import openai

    examples = [{"id": f"q-{i}", "a": 17 + 9 * i, "b": 33 - 4 * i} for i in range(3)]
    val = [{"id": f"v-{i}", "a": 5 + i, "b": 7} for i in range(2)]
    with (
        serve(calculator_model()) as policy,
        serve(calculator_model(logprobs=False)) as bare,
        serve(calculator_model(token_ids=False, tokens_as_ids=False)) as texts,
    ):
        clients = {
            name: openai.AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
            for name, server in (("policy", policy), ("bare", bare), ("texts", texts))
        }
        solvers = {name: calculator(clients[name]) for name in ("policy", "bare")}

        async def rollout(example: dict[str, Any]) -> float:
            solve = solvers["bare" if example["id"] == UNTRAINABLE else "policy"]
            answer = await solve(f"What is {example['a']}+{example['b']}?")
            await clients["texts"].chat.completions.create(  # a sub-agent: context only,
                model="summariser",  # its logprobs' tokens as text, without ids
                messages=[{"role": "user", "content": f"Summarise: {answer}"}],
                logprobs=True,
            )
            metadata = at.current_trajectory().metadata
            if example["id"] == "q-1" and (metadata["step"], metadata["rollout"]) == (1, 2):
                raise RuntimeError("the calculator tool crashed")
            return 1.0 if answer == f"The answer is {example['a'] + example['b']}." else 0.0

        model: Any = art.TrainableModel(
            name="calc",
            project="viewer",
            base_model="Qwen/Qwen2.5-0.5B-Instruct",
            run_name="calc",
            base_path=str(out.parent / f"{out.name}-art"),
        )
        backend = at.DryRunBackend(out.parent / f"{out.name}-dry-run")
        await model.register(backend)
        trainer = at.Trainer(
            model,
            backend,
            rollout,
            examples,
            val_dataset=val,
            group_size=3,
            groups_per_step=3,
            output_dir=out,
            max_exceptions=0.5,
            progress=False,
            log_to_model=False,
        )
        await trainer.train(num_steps=2)
        for client in clients.values():
            await client.close()


def journal_lines(out: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted(out.glob("journal/step-*/rollouts.jsonl"))
        for line in path.read_text().splitlines()
    ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The demo's run and the calculator's, made once for the module (ART loads here)."""
    from arttrace.app.demo import run_demo

    root = tmp_path_factory.mktemp("viewer")
    demo, calc = root / "runs" / "demo", root / "runs" / "calc"
    _warnings.reset()
    at.instrument()  # the demo instruments too; the calculator's run needs it as well
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            asyncio.run(run_demo(demo, steps=4, backend="dry-run"))
            asyncio.run(train_calculator(calc))
    finally:
        at.uninstrument()
        _warnings.reset()
    given = {type(w.message) for w in caught}
    assert at.UntrainableTurnWarning in given  # the example served without logprobs, told
    return {"demo": demo, "calc": calc}


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Qwen2.5 tokenizer the calculator's servers use, saved as a model folder holds it."""
    folder = tmp_path_factory.mktemp("tokenizer") / "models" / "qwen2.5-instruct"
    qwen_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def cpu_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CPU demo (``arttrace demo``'s default), as short as it runs: its tiny Qwen2 samples
    Qwen2.5 token ids, and each checkpoint it saves holds the tokenizer."""
    import torch

    from arttrace.app._greeter_demo import CPUSettings, run_greeter_demo

    out = tmp_path_factory.mktemp("cpu") / "demo"
    torch.manual_seed(0)
    settings = CPUSettings(examples=1, rollouts=2, steps=1, warm_up_batches=1, validation=1)
    _warnings.reset()
    try:  # on a thread of its own: the browser's Playwright runs an event loop on this one
        with concurrent.futures.ThreadPoolExecutor(1) as thread:
            thread.submit(asyncio.run, run_greeter_demo(out, settings=settings)).result()
    finally:
        at.uninstrument()
        _warnings.reset()
    return out


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as context:
        yield context


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Screenshots:
    return Screenshots(tmp_path_factory.mktemp("screenshots"))


@pytest.fixture(scope="module")
def viewer(runs: dict[str, Path]) -> Iterator[Viewer]:
    """The viewer over both runs, given as ``arttrace view runs/demo runs/calc`` gives them
    (the pages show the paths as given)."""
    here = Path.cwd()
    os.chdir(runs["demo"].parent.parent)
    try:
        served = Viewer([Path("runs/demo"), Path("runs/calc")])
        served.start()
    finally:
        os.chdir(here)
    yield served
    served.stop()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    opened = browser.new_page()
    opened.set_default_timeout(10_000)
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    yield opened
    opened.close()
    assert not errors, f"the page's scripts failed: {errors}"


def ready(page: Any, name: str, timeout: float = 10_000) -> None:
    """Wait for page ``name`` to be drawn."""
    page.wait_for_function(f"document.body.dataset.ready === {name!r}", timeout=timeout)


def hover_step(page: Any, chart: str, step: int, dy: float = 0.5) -> None:
    """Move the mouse over ``step`` on ``chart`` (``dy``: how far down the plot)."""
    x = page.evaluate(f"window.arttraceCharts[{chart!r}].valToPos({step}, 'x')")
    over = page.locator(f'[data-chart="{chart}"] .u-over').bounding_box()
    x = min(max(x, 1), over["width"] - 1)  # the plot's very edge is outside it
    page.mouse.move(over["x"] + x, over["y"] + over["height"] * dy)


def fit(page: Any) -> None:
    """Make the window as tall as the page: a hover then scrolls nothing, and the full-page
    screenshot has the header at its top."""
    height = page.evaluate("document.documentElement.scrollHeight")
    page.set_viewport_size({"width": 1360, "height": min(max(height, 900), 6000)})


def show(page: Any, url: str, name: str) -> None:
    page.goto(url)
    ready(page, name)


# -- the overview -------------------------------------------------------------------------------


def test_the_demo_run_opens_with_its_reward_curve(viewer, runs, page, shots):
    metrics = [json.loads(line) for line in (runs["demo"] / "metrics.jsonl").read_text().split()]
    show(page, viewer.url, "overview")
    page.wait_for_function("window.arttraceCharts && window.arttraceCharts.reward")
    assert page.locator(".problem").count() == 0
    legend = page.locator('[data-chart="reward"] .u-legend')
    for line in metrics:  # hover each step: the legend shows metrics.jsonl's reward there
        hover_step(page, "reward", line["step"])
        row = legend.locator("tr.u-series", has_text="demo · train")
        shown = row.locator(".u-value").inner_text()
        assert float(shown) == pytest.approx(line["reward_mean"], abs=5e-5), line["step"]
        step = legend.locator("tr.u-series").first.locator(".u-value").inner_text()
        assert step == str(line["step"])
    validation = [json.loads(v) for v in (runs["calc"] / "validation.jsonl").read_text().split()]
    hover_step(page, "reward", validation[-1]["step"], dy=0.1)
    row = legend.locator("tr.u-series", has_text="calc · validation")
    assert float(row.locator(".u-value").inner_text()) == pytest.approx(
        validation[-1]["reward_mean"], abs=5e-5
    )
    table = page.locator('section[data-run="0"] table.steps tbody tr')
    assert table.count() == len(metrics)  # one row per step, and each leads to its groups
    shots.take(page, "viewer-overview")


# -- step -> group -> run -----------------------------------------------------------------------


def test_a_run_shows_its_tool_call_and_tokens_as_the_journal_says(viewer, runs, page, shots):
    lines = [
        line
        for line in journal_lines(runs["calc"])
        if line["trajectory"]["example_id"] == "q-0" and line["trajectory"]["metadata"]["step"] == 0
    ]
    show(page, viewer.url, "overview")
    page.locator('section[data-run="1"] table.steps tbody tr[data-href$="/step/0"]').click()
    ready(page, "step")
    assert page.locator("table.groups tbody tr").count() == 3
    shots.take(page, "viewer-step")
    page.locator("table.groups tbody tr", has_text="q-0").click()
    ready(page, "group")
    rewards = page.locator("table.runs tbody tr")
    assert rewards.count() == 3
    journaled_rewards = {line["slot"][1]: line["trajectory"]["reward"] for line in lines}
    mean = sum(journaled_rewards.values()) / 3
    std = (sum((r - mean) ** 2 for r in journaled_rewards.values()) / 3) ** 0.5
    for k in range(3):  # each run's reward, and its advantage as ART computes it
        cells = rewards.nth(k).locator("td").all_inner_texts()
        reward = journaled_rewards[int(cells[0])]
        assert float(cells[1]) == reward
        assert float(cells[2]) == pytest.approx((reward - mean) / (std + 1e-6), abs=5e-4)
    shots.take(page, "viewer-group")
    rewards.first.click()
    ready(page, "run")
    fit(page)
    rollout = int(page.locator(".fact", has_text="rollout").locator(".fact-value").inner_text())
    journaled = next(line for line in lines if line["slot"][1] == rollout)["trajectory"]
    policy = [c for c in journaled["calls"] if c["trainable"]]
    context = [c for c in journaled["calls"] if not c["trainable"]]

    main = page.locator('.conversation[data-conversation="0"]')
    call = main.locator(".tool-call").first
    asked = policy[0]["choices"][0]["message"]["tool_calls"][0]["function"]
    assert call.locator(".tool-name").inner_text() == "add"
    assert json.loads(call.locator(".args").inner_text()) == json.loads(asked["arguments"])
    result = main.locator('.msg[data-role="tool"]').first.locator(".text").inner_text()
    assert result == str(sum(json.loads(asked["arguments"]).values()))

    # every sampled token, in order, coloured as the journal's mask says: the policy's turns
    # are trainable, the sub-agent's (a call outside @trainable) is context
    turns = main.locator(".turn")
    assert turns.count() == len(policy)
    for turn, call_record in zip(turns.all(), policy, strict=True):
        choice = call_record["choices"][0]
        chips = turn.locator(".tok")
        assert chips.evaluate_all("cs => cs.map(c => Number(c.dataset.id))") == choice["token_ids"]
        assert chips.evaluate_all("cs => cs.map(c => Number(c.dataset.lp))") == choice["logprobs"]
        assert set(chips.evaluate_all("cs => cs.map(c => c.className)")) == {"tok trainable"}
    sub = page.locator('.conversation[data-conversation="1"] .turn')
    assert sub.count() == len(context) == 1
    chips = sub.locator(".tok")
    summary = context[0]["choices"][0]
    assert summary["token_ids"] is None and summary["tokens"]  # the server sent text, no ids
    assert chips.evaluate_all("cs => cs.map(c => c.dataset.text)") == summary["tokens"]
    assert set(chips.evaluate_all("cs => cs.map(c => c.className)")) == {"tok context"}
    assert "outside every @trainable function" in sub.locator(".why").inner_text()
    green = turns.first.locator(".tok").first.evaluate("c => getComputedStyle(c).backgroundColor")
    grey = chips.first.evaluate("c => getComputedStyle(c).backgroundColor")
    red, g, blue = (int(v) for v in re.findall(r"\d+", green)[:3])
    assert g > red and g > blue and green != grey

    # hovering a token shows the journal's id, text (when the server sent it) and logprob;
    # without a tokenizer (none in the folder, its model "policy" in no cache) the page says
    # how to see the ids' text
    choice = policy[0]["choices"][0]
    k = len(choice["token_ids"]) // 2
    turns.first.locator(".tok").nth(k).hover()
    tip = page.locator("#tip")
    assert tip.is_visible()
    assert tip.locator(".tip-id").inner_text() == str(choice["token_ids"][k])
    assert float(tip.locator(".tip-lp").inner_text()) == choice["logprobs"][k]
    assert "ids only: --tokenizer shows the text" in tip.inner_text()
    assert "trainable" in tip.inner_text()
    assert "--tokenizer NAME_OR_PATH" in page.locator(".legend .tok-source").inner_text()
    header = page.locator('.folder[data-index="1"] .tokenizer')
    assert header.inner_text() == "ids only: --tokenizer shows text"
    k = len(summary["tokens"]) - 2
    chips.nth(k).hover()
    assert json.loads(tip.locator(".tip-text").inner_text()) == summary["tokens"][k]
    assert tip.locator(".tip-from").inner_text().strip() == "(sent by the server)"
    assert float(tip.locator(".tip-lp").inner_text()) == summary["logprobs"][k]
    assert "context" in tip.inner_text()
    assert "finish: tool_calls" in turns.first.inner_text()
    assert "recorded by: openai" in turns.first.inner_text()


def test_a_tokenizer_gives_each_token_its_text(runs, qwen_folder, browser, shots):
    """``arttrace view --tokenizer FOLDER``: every chip shows the text the tokenizer gives
    its id, hovering shows id, text and logprob, and the header names the tokenizer."""
    tokenizer = qwen_tokenizer()  # the one saved in qwen_folder
    here = Path.cwd()
    os.chdir(qwen_folder.parent.parent)  # `arttrace view --tokenizer models/qwen2.5-instruct`
    try:
        served = Viewer([runs["calc"]], tokenizer=Path("models/qwen2.5-instruct"))
    finally:
        os.chdir(here)
    served.start()
    page = browser.new_page()
    page.set_default_timeout(10_000)
    try:
        found = httpx.get(served.url + "api/runs/0/trajectories", params={"example_id": "q-0"})
        row = next(r for r in found.json()["rows"] if r["step"] == 0)
        journaled = next(
            line["trajectory"]
            for line in journal_lines(runs["calc"])
            if line["trajectory"]["example_id"] == "q-0"
            and line["trajectory"]["metadata"]["step"] == 0
            and line["slot"][1] == row["rollout"]
        )
        policy = [c["choices"][0] for c in journaled["calls"] if c["trainable"]]
        show(page, served.url + f"#/r/0/run/{row['id']}", "run")
        fit(page)
        header = page.locator('.folder[data-index="0"] .tokenizer')
        assert header.inner_text() == "text: models/qwen2.5-instruct"
        assert page.locator(".legend .tok-source").inner_text() == (
            "each token's text is decoded by the tokenizer models/qwen2.5-instruct (given "
            "with --tokenizer)"
        )

        turns = page.locator('.conversation[data-conversation="0"] .turn')
        assert turns.count() == len(policy)
        for turn, choice in zip(turns.all(), policy, strict=True):
            ids = choice["token_ids"]
            chips = turn.locator(".tok")
            texts = chips.evaluate_all("cs => cs.map(c => c.dataset.text)")
            assert texts == [tokenizer.decode([i]) for i in ids]  # each id's own text
            assert "".join(texts) == tokenizer.decode(ids)
        first = "".join(
            turns.first.locator(".tok").evaluate_all("cs => cs.map(c => c.dataset.text)")
        )
        assert first.startswith("<tool_call>\n") and '"name": "add"' in first  # Qwen's own
        assert first.endswith("</tool_call><|im_end|>")
        shown = turns.first.locator(".tok").all_inner_texts()
        assert shown[0] == "<tool_call>" and shown[1] == "↵"  # a line break, drawn

        ids, logprobs = policy[0]["token_ids"], policy[0]["logprobs"]
        k = next(k for k, i in enumerate(ids) if tokenizer.decode([i]) == "add")
        turns.first.locator(".tok").nth(k).hover()
        tip = page.locator("#tip")
        assert tip.locator(".tip-id").inner_text() == str(ids[k])
        assert json.loads(tip.locator(".tip-text").inner_text()) == "add"
        assert tip.locator(".tip-from").inner_text().strip() == "(decoded by the tokenizer)"
        assert float(tip.locator(".tip-lp").inner_text()) == logprobs[k]
        shots.take(page, "viewer-run")
    finally:
        page.close()
        served.stop()


def test_the_cpu_demo_s_tokenizer_is_found_in_its_folder(cpu_demo, browser, qwen_folder):
    """``arttrace view`` of the CPU demo without --tokenizer: the tokenizer of its latest
    checkpoint gives the tokens their text, and the header says which it is."""
    checkpoints = cpu_demo / ".art" / "arttrace-demo" / "models" / "demo" / "checkpoints"
    (latest,) = checkpoints.iterdir()
    older = checkpoints / f"{int(latest.name) - 1:04d}"  # an older step, written after it:
    shutil.copytree(qwen_folder, older)  # the highest step wins
    for file in older.iterdir():
        os.utime(file)
    line = journal_lines(cpu_demo)[0]
    ids = line["trajectory"]["calls"][0]["choices"][0]["token_ids"]
    served = Viewer([cpu_demo])
    served.start()
    page = browser.new_page()
    page.set_default_timeout(10_000)
    try:
        rows = httpx.get(served.url + "api/runs/0/trajectories").json()["rows"]
        row = next(r for r in rows if (r["step"], r["rollout"]) == (0, line["slot"][1]))
        show(page, served.url + f"#/r/0/run/{row['id']}", "run")
        header = page.locator('.folder[data-index="0"] .tokenizer.ready')
        header.wait_for(timeout=60_000)  # transformers loads the first time it is needed
        assert header.inner_text() == "text: …/demo/checkpoints/" + latest.name
        assert "saved in the run folder" in header.get_attribute("title")
        tokenizer = qwen_tokenizer()
        chips = page.locator(".turn .tok[data-text]")
        chips.first.wait_for()  # the page fetched the run again once the tokenizer was in
        texts = chips.evaluate_all("cs => cs.map(c => c.dataset.text)")
        assert texts == [tokenizer.decode([i]) for i in ids]
    finally:
        page.close()
        served.stop()


def test_the_runs_model_s_tokenizer_comes_from_the_hugging_face_cache(
    qwen_folder, tmp_path, monkeypatch
):
    """Runs whose calls name a model the local Hugging Face cache holds: that tokenizer gives
    their ids text, found by itself (the cache is one made here: HF_HUB_CACHE's setting)."""
    from huggingface_hub import constants

    repo = tmp_path / "hub" / "models--arttrace--qwen-test"
    shutil.copytree(qwen_folder, repo / "snapshots" / ("0" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    tokenizer = qwen_tokenizer()
    ids = [*tokenizer.encode("Hello, world!"), tokenizer.convert_tokens_to_ids("<|im_end|>")]
    call = {
        "model": "arttrace/qwen-test",
        "messages": [{"role": "user", "content": "Say hello"}],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello, world!"},
                "finish_reason": "stop",
                "logprobs": [-0.5] * len(ids),
                "token_ids": ids,
            }
        ],
        "prompt_token_ids": [1, 2, 3],
        "trainable": True,
    }
    saved = tmp_path / "saved"
    saved.mkdir()
    at.Trajectory.from_dict({"example_id": "hello", "reward": 1.0, "calls": [call]}).save(
        saved / "hello.json"
    )
    served = Viewer([saved])
    served.start()
    try:
        deadline = time.monotonic() + 60  # transformers may load here the first time
        found = httpx.get(served.url + "api/runs").json()["runs"][0]["tokenizer"]
        while found["state"] != "ready" and time.monotonic() < deadline:
            time.sleep(0.1)
            found = httpx.get(served.url + "api/runs").json()["runs"][0]["tokenizer"]
        assert (found["state"], found["name"], found["origin"]) == (
            "ready",
            "arttrace/qwen-test",
            "model, HF cache",
        )
        rows = httpx.get(served.url + "api/runs/0/trajectories").json()["rows"]
        run = httpx.get(served.url + f"api/runs/0/trajectories/{rows[0]['id']}").json()
        tokens = run["conversations"][0]["items"][1]["tokens"]
        assert tokens["ids"] == ids and tokens["text_from"] == "tokenizer"
        assert tokens["text"] == [tokenizer.decode([i]) for i in ids]
        assert "".join(tokens["text"]) == "Hello, world!<|im_end|>"
    finally:
        served.stop()


def test_a_tokenizer_that_cannot_load_says_what_to_do(tmp_path, qwen_folder):
    """Each way --tokenizer can be wrong, told at once (before transformers loads) in one line
    that says what to give instead."""
    from arttrace._tokenizers._find import TokenizerError, problem

    empty = tmp_path / "empty"
    empty.mkdir()
    damaged = tmp_path / "damaged"
    shutil.copytree(qwen_folder, damaged)
    (damaged / "tokenizer.json").write_text("{not json")
    told = {
        "nobody/no-such-model": "hf download nobody/no-such-model",  # never downloaded
        str(empty): "the folder holds no tokenizer",
        str(qwen_folder / "tokenizer.json"): f"give the folder that holds it ({qwen_folder})",
    }
    for given, fix in told.items():
        found = problem(given)
        assert found is not None and fix in found and "\n" not in found, given
        with pytest.raises(TokenizerError, match=re.escape(fix)):
            Viewer([tmp_path], tokenizer=given)
    assert problem(str(damaged)) is None  # it looks like one: loading says what is wrong
    with pytest.raises(TokenizerError, match="cannot be loaded") as caught:
        Viewer([tmp_path], tokenizer=damaged)
    assert "\n" not in str(caught.value) and "save_pretrained" in str(caught.value)


def test_a_run_that_raised_shows_its_exception(viewer, runs, page):
    raised = next(
        line for line in journal_lines(runs["calc"]) if line["trajectory"]["exception"] is not None
    )["trajectory"]
    show(page, viewer.url + "#/find?run=1&example_id=q-1&step=1", "find")
    page.locator("table.found-runs tbody tr", has_text="RuntimeError").click()
    ready(page, "run")
    box = page.locator(".exception")
    assert box.locator("h3").inner_text() == "The run raised RuntimeError"
    assert box.locator(".problem-message").inner_text() == raised["exception"]["message"]
    box.locator("summary").click()
    assert "the calculator tool crashed" in box.locator("pre").inner_text()


def test_a_long_run_comes_in_bounded_parts_and_whole_on_demand(browser, tmp_path):
    from arttrace.viewer._present import MAX_TEXT, MAX_TOKENS

    ids = list(range(1000, 1000 + MAX_TOKENS + 500))
    logprobs = [-((k % 7) / 7) for k in range(len(ids))]
    long_text = "".join(f"line {k}: a long tool result\n" for k in range(1500))
    call = {
        "model": "policy",
        "messages": [{"role": "user", "content": long_text}],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok " * 10},
                "finish_reason": "length",
                "logprobs": logprobs,
                "token_ids": ids,
            }
        ],
        "prompt_token_ids": [1, 2, 3],
        "trainable": True,
        "agent": "solve",
    }
    saved = tmp_path / "long.json"
    at.Trajectory.from_dict({"example_id": "long", "reward": 0.5, "calls": [call]}).save(saved)
    served = Viewer([saved])
    served.start()
    page = browser.new_page()
    page.set_default_timeout(10_000)
    try:
        rows = httpx.get(served.url + "api/runs/0/trajectories").json()["rows"]
        answer = httpx.get(served.url + f"api/runs/0/trajectories/{rows[0]['id']}").json()
        user, turn = answer["conversations"][0]["items"]
        assert len(user["message"]["content"]) == MAX_TEXT  # each answer is bounded
        assert user["message"]["_cut"] == len(long_text) - MAX_TEXT
        assert turn["tokens"]["ids"] == ids[:MAX_TOKENS] and turn["tokens"]["total"] == len(ids)

        show(page, served.url + f"#/r/0/run/{rows[0]['id']}", "run")
        message = page.locator('.msg[data-role="user"]')
        assert "more characters not shown" in message.inner_text()
        message.locator("button.more").click()
        page.wait_for_function(
            "document.querySelector('.msg[data-role=user] .text').textContent.length > 20000"
        )
        assert message.locator(".text").inner_text().strip() == long_text.strip()
        chips = page.locator(".turn .tok")
        assert chips.count() == MAX_TOKENS
        page.locator(".turn button.more", has_text=f"show all {len(ids):,} tokens").click()
        page.wait_for_function(f"document.querySelectorAll('.turn .tok').length === {len(ids)}")
        assert chips.evaluate_all("cs => cs.map(c => Number(c.dataset.id))") == ids
        assert chips.evaluate_all("cs => cs.map(c => Number(c.dataset.lp))") == logprobs
    finally:
        page.close()
        served.stop()


# -- find ---------------------------------------------------------------------------------------


def test_filtering_by_an_untrainable_cause_finds_exactly_its_runs(viewer, runs, page, shots):
    def untrainable(trajectory: dict[str, Any]) -> bool:
        return any(
            choice["logprobs"] is None
            for call in trajectory["calls"]
            if call["trainable"]
            for choice in call["choices"]
        )

    expected = {
        (line["trajectory"]["metadata"]["step"], line["slot"][1], line["trajectory"]["example_id"])
        for line in journal_lines(runs["calc"])
        if untrainable(line["trajectory"])
    }
    assert expected and {example for *_, example in expected} == {UNTRAINABLE}
    show(page, viewer.url + "#/find?run=1", "find")
    option = page.locator('select[name="cause"] option', has_text="no logprobs")
    assert option.inner_text() == f"no logprobs ({len(expected)} runs)"
    page.select_option('select[name="cause"]', "no logprobs")
    page.wait_for_function("location.hash.includes('cause=no')")
    ready(page, "find")
    page.wait_for_selector(f'.found[data-total="{len(expected)}"]')
    rows = page.locator("table.found-runs tbody tr")
    found = {
        (int(cells[0]), int(cells[2]), cells[4])
        for cells in (rows.nth(k).locator("td").all_inner_texts() for k in range(rows.count()))
    }
    assert found == expected
    shots.take(page, "viewer-find")
    rows.first.click()  # the run says which turn cannot train, and why
    ready(page, "run")
    turn = page.locator('.conversation[data-conversation="0"] .turn').first
    assert turn.get_attribute("data-trainable") == "no"
    assert turn.locator(".why").inner_text().startswith("Untrainable: no logprobs")
    classes = turn.locator(".tok").evaluate_all("cs => cs.map(c => c.className)")
    assert classes and set(classes) == {"tok context no-lp"}  # ids, but no logprob to shade by
    page.go_back()
    ready(page, "find")
    page.locator('input[name="text"]').fill("tool crashed")  # text: none of these runs
    page.locator('button[type="submit"]').click()
    page.wait_for_selector('.found[data-total="0"]')


def test_find_pages_through_many_runs(viewer, runs, page):
    total = len(journal_lines(runs["demo"]))
    show(page, viewer.url + "#/find?run=0&order=-reward", "find")
    page.wait_for_selector(f'.found[data-total="{total}"]')
    rows = page.locator("table.found-runs tbody tr")
    assert rows.count() == min(total, 50)
    rewards = [float(rows.nth(k).locator("td").nth(5).inner_text()) for k in range(rows.count())]
    assert rewards == sorted(rewards, reverse=True)


# -- live ---------------------------------------------------------------------------------------


def test_a_new_journal_line_appears_live(runs, browser, tmp_path):
    folder = tmp_path / "calc"
    shutil.copytree(runs["calc"], folder, ignore=shutil.ignore_patterns(".arttrace-index*"))
    served = Viewer([folder])
    served.start()
    page = browser.new_page()
    page.set_default_timeout(10_000)
    try:
        show(page, served.url + "#/find?run=0&example_id=live-1", "find")
        page.wait_for_selector('.found[data-total="0"]')
        line = journal_lines(folder)[0]
        line["slot"] = [7, 0]
        line["trajectory"]["example_id"] = "live-1"
        rollouts = folder / "journal" / "step-00001" / "rollouts.jsonl"
        with rollouts.open("ab") as file:
            file.write(json.dumps(line).encode() + b"\n")
            appended = time.monotonic()
        page.wait_for_selector('.found[data-total="1"]', timeout=LIVE_SECONDS * 1000)
        print(f"a journal line on the page after {time.monotonic() - appended:.2f} s")
        assert page.locator("table.found-runs tbody tr").count() == 1

        show(page, served.url, "overview")
        metrics = folder / "metrics.jsonl"
        last = json.loads(metrics.read_text().split()[-1])
        new = {**last, "step": last["step"] + 1, "reward_mean": 0.123}
        with metrics.open("ab") as file:
            file.write(json.dumps(new).encode() + b"\n")
            appended = time.monotonic()
        page.wait_for_selector(
            f'table.steps tr[data-href$="/step/{new["step"]}"]', timeout=LIVE_SECONDS * 1000
        )
        print(f"a metrics line on the page after {time.monotonic() - appended:.2f} s")
        xs = page.evaluate("window.arttraceCharts.reward.data[0]")
        assert xs[-1] == new["step"]
    finally:
        page.close()
        served.stop()


# -- bad folders ----------------------------------------------------------------------------------


def test_a_bad_run_folder_gives_a_clear_page(runs, browser, tmp_path, shots):
    not_a_run = tmp_path / "notes"
    not_a_run.mkdir()
    (not_a_run / "todo.txt").write_text("not a run")
    damaged = tmp_path / "damaged"
    shutil.copytree(runs["calc"], damaged, ignore=shutil.ignore_patterns(".arttrace-index*"))
    rollouts = damaged / "journal" / "step-00000" / "rollouts.jsonl"
    whole = rollouts.read_bytes()
    lines = whole.split(b"\n")
    lines[3] = b'{"slot": [0, 1], "trajectory": {"example_id": "q-'  # cut short mid-file
    rollouts.write_bytes(b"\n".join(lines))
    served = Viewer([not_a_run, damaged])
    served.start()
    page = browser.new_page()
    page.set_default_timeout(10_000)
    try:
        show(page, served.url, "overview")
        page.wait_for_selector(".problem >> nth=1")
        text = page.locator("main").inner_text()
        assert "Traceback" not in text
        boxes = page.locator(".problem")
        first, second = boxes.nth(0).inner_text(), boxes.nth(1).inner_text()
        assert page.locator(".charts").is_hidden()  # no run to chart
        assert "notes cannot be shown" in first
        assert f"{not_a_run} is not a run folder" in first or "output_dir" in first
        assert "What to do:" in first
        assert "damaged cannot be shown" in second
        assert f"{rollouts}" in second and "line 4" in second
        assert "restore the file from a copy" in second
        shots.take(page, "viewer-bad-folder")
        show(page, served.url + "#/r/1/step/0", "step")  # its pages say the same
        assert "restore the file from a copy" in page.locator(".problem").inner_text()

        rollouts.write_bytes(whole)  # repaired: the page shows the run by itself
        page.wait_for_selector("table.groups tbody tr", timeout=10_000)
        assert page.locator("table.groups tbody tr").count() == 3
    finally:
        page.close()
        served.stop()


def test_an_unreadable_folder_says_whose_it_is(tmp_path):
    error = PermissionError(13, "Permission denied", str(tmp_path / "journal"))
    problem = problem_of(tmp_path, error)
    assert problem.message == f"cannot read {tmp_path / 'journal'}: permission denied"
    assert "as the user who ran the training" in problem.fix


# -- the server -----------------------------------------------------------------------------------


def test_the_viewer_is_read_only_and_answers_only_to_its_own_name(viewer):
    with httpx.Client(base_url=viewer.url) as client:
        index = client.get("/")
        assert index.status_code == 200 and index.headers["cache-control"] == "no-cache"
        static = re.search(r'href="(static/\w+/)vendor/uplot/uPlot.min.css"', index.text)
        assert static, index.text
        kept = client.get(f"/{static.group(1)}vendor/uplot/uPlot.iife.min.js")  # versioned URL:
        # the browser keeps it for good (a new version of the files has a new URL)
        assert "uPlot" in kept.text and "immutable" in kept.headers["cache-control"]
        for method in ("POST", "PUT", "PATCH", "DELETE"):
            answer = client.request(method, "/api/runs")
            assert answer.status_code == 405, method
            assert answer.headers["allow"] == "GET, HEAD"
        refused = client.get("/api/runs", headers={"host": "attacker.example:80"})
        assert refused.status_code == 421  # a page reaching 127.0.0.1 by DNS rebinding
        assert client.get("/api/runs", headers={"host": "localhost"}).status_code == 200
        bad = client.get("/api/runs/1/trajectories", params={"min_reward": "high"})
        assert bad.status_code == 400 and "min_reward must be a number" in bad.json()["error"]
        big = client.get("/api/runs/1/trajectories", params={"limit": 100_000})
        assert big.status_code == 400  # every answer is bounded
        assert client.get("/api/runs/7/overview").status_code == 404
    host, _ = viewer.server.address  # type: ignore[union-attr]
    assert host == "127.0.0.1"


def test_the_view_command_serves_and_opens_a_browser_only_where_there_is_a_display(runs, tmp_path):
    fake_browser = tmp_path / "browser.sh"  # webbrowser runs $BROWSER: it notes the URL
    fake_browser.write_text('#!/bin/sh\necho "$1" >> "$OPENED"\n')
    fake_browser.chmod(0o755)
    command = [
        sys.executable,
        "-c",
        "import argparse, sys\n"
        "from arttrace.app.view_command import add_view_command\n"
        "parser = argparse.ArgumentParser(prog='arttrace')\n"
        "commands = parser.add_subparsers(dest='command')\n"
        "add_view_command(commands)\n"
        "args = parser.parse_args(sys.argv[1:])\n"
        "sys.exit(args.run(args, commands.choices['view']))\n",
        "view",
        "--host",
        "0.0.0.0",
        str(runs["demo"]),
    ]
    cases = {
        "display": (":0", []),
        "no display": ("", []),
        "--no-browser": (":0", ["--no-browser"]),
    }
    processes = {}
    for name, (display, extra) in cases.items():  # all three at once: each loads for a second
        env = {
            **os.environ,
            "DISPLAY": display,
            "WAYLAND_DISPLAY": "",
            "BROWSER": str(fake_browser),
        }
        processes[name] = subprocess.Popen(
            [*command, *extra, "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**env, "OPENED": str(tmp_path / name)},
        )
    refused = subprocess.Popen(  # told in one line, before any server starts
        [*command, "--tokenizer", str(tmp_path / "no-such-tokenizer"), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for name, process in processes.items():
        try:
            line = process.stdout.readline()  # type: ignore[union-attr]
            url = re.search(r"http://\S+/", line)
            assert url, line
            assert httpx.get(url.group()).status_code == 200
            shown = httpx.get(url.group() + "api/runs").json()["runs"]
            assert [run["path"] for run in shown] == [str(runs["demo"])]
        finally:
            process.send_signal(signal.SIGTERM)
            out, err = process.communicate(timeout=20)
        assert process.returncode == 0, err
        assert "stopped" in out
        assert "can read these runs' prompts" in err  # --host 0.0.0.0 is told
        opened = tmp_path / name
        got = opened.read_text().split() if opened.exists() else []
        assert got == ([url.group()] if name == "display" else []), name
    out, err = refused.communicate(timeout=60)
    assert refused.returncode == 2 and out == "", err
    assert err == (
        f"arttrace view: --tokenizer {tmp_path / 'no-such-tokenizer'}: no such folder: give the "
        "folder a model's tokenizer was saved in (it holds tokenizer.json), or a model name in "
        "the Hugging Face cache\n"
    )


def test_the_view_command_loads_its_tokenizer_before_serving(runs, qwen_folder, capsys):
    """``arttrace view --tokenizer FOLDER`` (here, in this process: transformers is loaded
    already): the folders' tokens are decoded by it from the first page on."""
    from arttrace.app.view_command import add_view_command

    parser = argparse.ArgumentParser(prog="arttrace")
    commands = parser.add_subparsers(dest="command")
    add_view_command(commands)
    with socket.socket() as probe:  # a free port, for the helper below to ask
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    given = ["--no-browser", "--port", str(port), "--tokenizer", str(qwen_folder)]
    args = parser.parse_args(["view", *given, str(runs["calc"])])
    asked: list[dict[str, Any]] = []
    done = threading.Event()

    def ask_then_stop() -> None:
        deadline = time.monotonic() + 60
        while not asked and time.monotonic() < deadline:
            try:
                asked.append(httpx.get(f"http://127.0.0.1:{port}/api/runs").json())
            except httpx.TransportError:
                time.sleep(0.05)
        while not done.wait(0.2):  # until run() returns: its SIGTERM handler stops it
            os.kill(os.getpid(), signal.SIGTERM)

    before = signal.signal(signal.SIGTERM, lambda *_: None)
    helper = threading.Thread(target=ask_then_stop)
    helper.start()
    try:
        assert args.run(args, commands.choices["view"]) == 0
    finally:
        done.set()
        helper.join()
        signal.signal(signal.SIGTERM, before)
    (folder,) = asked[0]["runs"]
    assert folder["tokenizer"]["state"] == "ready"  # on the first answer: loaded before
    assert folder["tokenizer"]["name"] == str(qwen_folder)
    assert folder["tokenizer"]["origin"] == "--tokenizer"
    printed = capsys.readouterr()
    assert printed.err == f"arttrace view: loading the tokenizer {qwen_folder}\n"
    assert "stopped" in printed.out
