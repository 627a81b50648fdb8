"""``arttrace view`` over runs of several policies, in a real headless Chromium: a reward curve
per policy on the overview, each turn of a run labelled and coloured by its policy, groups per
policy, and find filtering by policy. The runs are real Trainer runs (``support.policies``): a
planner and an executor as two policies of one Trainer, and as two roles of one model."""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from arttrace.store import open_run
from arttrace.viewer import Viewer
from support.browser import Screenshots, chromium
from support.policies import rewards, two_roles


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("policies")
    return {
        "two": two_roles(root / "two", several=True, steps=3),
        "roles": two_roles(root / "roles"),
    }


@pytest.fixture(scope="module")
def viewer(folders: dict[str, Path]) -> Iterator[Viewer]:
    served = Viewer([folders["two"], folders["roles"]])
    served.start()
    yield served
    served.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as context:
        yield context


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Screenshots:
    return Screenshots(tmp_path_factory.mktemp("screenshots"))


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    opened = browser.new_page()
    opened.set_default_timeout(10_000)
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    yield opened
    opened.close()
    assert not errors, f"the page's scripts failed: {errors}"


def show(page: Any, url: str, name: str) -> None:
    page.goto(url)
    page.wait_for_function(f"document.body.dataset.ready === {name!r}")


def hover_step(page: Any, chart: str, step: int) -> None:
    x = page.evaluate(f"window.arttraceCharts[{chart!r}].valToPos({step}, 'x')")
    over = page.locator(f'[data-chart="{chart}"] .u-over').bounding_box()
    x = min(max(x, 1), over["width"] - 1)
    page.mouse.move(over["x"] + x, over["y"] + over["height"] * 0.5)


def test_the_overview_draws_a_reward_curve_per_policy(viewer, folders, page, shots):
    metrics = [json.loads(x) for x in (folders["two"] / "metrics.jsonl").read_text().split()]
    show(page, viewer.url, "overview")
    page.wait_for_function("window.arttraceCharts && window.arttraceCharts.reward")
    labels = page.evaluate("window.arttraceCharts.reward.series.map(s => s.label)")
    for policy in ("planner", "executor"):
        assert f"two · {policy} · train" in labels and f"two · {policy} · validation" in labels
        assert not any(label.startswith(f"roles · {policy}") for label in labels)  # one model
    colours = page.evaluate("window.arttraceCharts.reward.series.map(s => s._stroke)")
    by_label = dict(zip(labels, colours, strict=True))
    assert by_label["two · planner · train"] != by_label["two · executor · train"]
    legend = page.locator('[data-chart="reward"] .u-legend')
    for line in metrics:  # each policy's curve is its <policy>/reward_mean
        hover_step(page, "reward", line["step"])
        for policy in ("planner", "executor"):
            row = legend.locator("tr.u-series", has_text=f"two · {policy} · train")
            shown = float(row.locator(".u-value").inner_text())
            assert shown == pytest.approx(line[f"{policy}/reward_mean"], abs=5e-5)
    assert {m["planner/reward_mean"] for m in metrics} == {0.5}
    assert {m["executor/reward_mean"] for m in metrics} == {0.25}
    card = page.locator('section[data-run="0"]')
    assert card.locator(".policies .policy-tag").all_inner_texts() == ["planner", "executor"]
    cells = card.locator("table.steps tbody tr").first.locator(".policy-reward")
    assert cells.all_inner_texts() == [
        "planner 0.5 · 2 of 2 shipped",
        "executor 0.25 · 2 of 2 shipped",
    ]
    one_model = page.locator('section[data-run="1"]')  # two roles' names, no curves of theirs
    assert one_model.locator(".policy-tag").all_inner_texts() == ["executor", "planner"]
    assert one_model.locator(".policy-reward").count() == 0
    shots.take(page, "viewer-policies-overview")


def test_a_run_shows_which_policy_each_turn_belongs_to(viewer, folders, page, shots):
    with open_run(folders["two"]) as store:
        row = store.trajectories(step=0, limit=None)[3]
    show(page, viewer.url + f"#/r/0/run/{row.id}", "run")
    turns = page.locator(".conversation .turn")
    assert turns.count() == 2
    assert [turns.nth(k).get_attribute("data-policy") for k in range(2)] == [
        "planner",
        "executor",
    ]
    assert [turns.nth(k).get_attribute("data-trainable") for k in range(2)] == ["yes", "yes"]
    tags = [turns.nth(k).locator(".msg-head .policy-tag") for k in range(2)]
    assert [t.inner_text() for t in tags] == ["planner", "executor"]
    colour = "el => getComputedStyle(el).backgroundColor"
    assert tags[0].evaluate(colour) != tags[1].evaluate(colour)
    edge = "el => getComputedStyle(el).borderLeftColor"
    assert turns.nth(0).evaluate(edge) == tags[0].evaluate(colour)
    expected = rewards(row.rollout or 0)
    for policy in ("planner", "executor"):
        fact = page.locator(".fact", has_text=f"reward of {policy}")
        assert float(fact.locator(".fact-value").inner_text()) == expected[policy]
    groups = page.locator(".facts .policy-group")
    assert groups.count() == 2 and all("shipped" in t for t in groups.all_inner_texts())
    shots.take(page, "viewer-policies-run")


def test_groups_per_policy_with_each_policy_s_rewards(viewer, page):
    show(page, viewer.url + "#/r/0/step/1", "step")
    facts = page.locator(".fact", has=page.locator(".policy-step"))
    assert facts.locator(".fact-value").all_inner_texts() == [
        "0.5 · 2 of 2 shipped",
        "0.25 · 2 of 2 shipped",
    ]
    rows = page.locator("table.groups tbody tr")
    assert rows.count() == 4
    assert rows.locator(".policy-tag").all_inner_texts() == [
        "planner",
        "executor",
        "planner",
        "executor",
    ]
    rows.nth(1).click()
    page.wait_for_function("document.body.dataset.ready === 'group'")
    assert "policy=executor" in page.url
    runs = page.locator("table.runs tbody tr")
    shown = [float(runs.nth(k).locator("td").nth(1).inner_text()) for k in range(runs.count())]
    assert shown == [rewards(k)["executor"] for k in range(4)]


def test_find_filters_by_policy(viewer, folders, page):
    show(page, viewer.url + "#/find?run=0", "find")
    options = page.locator('select[name="policy"] option').all_inner_texts()
    assert options == ["any", "planner (24 runs)", "executor (24 runs)"]
    page.select_option('select[name="policy"]', "executor")
    page.wait_for_function("location.hash.includes('policy=executor')")
    page.wait_for_selector('.found[data-total="24"]')
    first = page.locator("table.found-runs tbody tr").first
    assert first.locator(".policy-tag").all_inner_texts() == ["planner", "executor"]
    api = viewer.url + "api/runs/0/trajectories?policy=nobody"
    assert json.loads(page.request.get(api).text())["total"] == 0
    # a run of one model whose roles name their policies: found by the names its calls have
    show(page, viewer.url + "#/find?run=1", "find")
    page.wait_for_selector('select[name="run"] option[value="1"]:checked', state="attached")
    page.wait_for_function("document.querySelectorAll('select[name=policy] option').length > 1")
    options = page.locator('select[name="policy"] option').all_inner_texts()
    assert options == ["any", "executor (16 runs)", "planner (16 runs)"]


def test_a_frozen_policy_s_turns_are_context(browser, tmp_path):
    with concurrent.futures.ThreadPoolExecutor(1) as thread:  # off Playwright's event loop
        made = thread.submit(
            two_roles, tmp_path / "frozen", several=True, steps=1, frozen="executor"
        )
        folder = made.result()
    served = Viewer([folder])
    served.start()
    page = browser.new_page()
    try:
        show(page, served.url + "#/r/0/run/1", "run")
        turns = page.locator(".conversation .turn")
        assert [turns.nth(k).get_attribute("data-trainable") for k in range(2)] == ["yes", "no"]
        assert turns.nth(1).get_attribute("data-policy") == "executor"
        assert turns.nth(1).locator(".why").inner_text() == (
            "Context: a turn of policy 'executor', which is frozen (served, not trained)"
        )
        assert set(turns.nth(1).locator(".tok").evaluate_all("cs => cs.map(c => c.className)")) == {
            "tok context"
        }
        show(page, served.url + "#/find?run=0", "find")
        options = page.locator('select[name="policy"] option').all_inner_texts()
        assert options == ["any", "planner (8 runs)", "executor (8 runs) · frozen"]
        show(page, served.url + "#/r/0/step/0", "step")
        assert page.locator("table.groups .policy-tag").all_inner_texts() == ["planner"] * 2
    finally:
        page.close()
        served.stop()
