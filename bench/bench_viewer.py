"""What ``arttrace view`` costs on a large run: the first index, each page's API answers, each
page drawn in a real browser, and the viewer's memory after browsing.

The run is ``bench_store.py``'s synthetic Trainer folder (a real captured calculator run,
varied run by run and stretched to ``--tokens`` tokens; 128 runs per step). The viewer runs in
a child process (its memory is its own): it is started on the folder with no index, and
the time until the folder is ready is the first index build as the viewer sees it. Then:

- the API, over HTTP, ``--repeat`` rounds each (p50 / p99): ``/api/runs``, the overview,
  a step's groups, a group's runs, a run (as ART trains on it), the causes, and searches
  (none, a cause, a rare word, a reward range, a deep page);
- the pages in headless Chromium (Debian's ``/usr/bin/chromium`` through Playwright): each
  page opened by navigating to its URL (the app loads, asks its API, draws; the static files
  cached after the first round), and the same page reached from another by its link (no
  reload): the browser's own time from the navigation's start (a link: the click) to the page
  drawn (``document.body.dataset.drawnMs``), and for information the time Playwright waited
  (its round trips to the browser included);
- the viewer's CPU while idle (its refresh timer finding nothing new), and its RSS
  (``VmRSS``) after all of it, and its peak (``VmHWM``).

    python bench/bench_viewer.py --runs 100000 --tokens 1000 [--dir /tmp/bench_viewer]
    python bench/bench_viewer.py --keep --keep-index ...   # again, on the same folder and index
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

from bench_store import write_run  # the synthetic run: one generator for both benchmarks


def serve(folder: Path) -> None:
    """The child: the viewer over ``folder``, its URL on stdout, until stdin closes."""
    from arttrace.viewer import Viewer

    viewer = Viewer([folder])
    print(viewer.start(), flush=True)
    sys.stdin.read()
    viewer.stop()


def memory(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":", 1) for line in status if ":" in line)
    return {k: int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM")}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def quantiles(times: list[float]) -> dict[str, float]:
    times = sorted(times)
    return {
        "p50_ms": times[len(times) // 2],
        "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))],
        "max_ms": times[-1],
    }


def api(base: str, repeat: int, rng: random.Random) -> dict[str, dict[str, float]]:
    with httpx.Client(base_url=base + "api/", timeout=60) as client:
        steps = client.get("runs/0/overview").json()["steps"]["step"]
        some = client.get("runs/0/trajectories", params={"step": steps[-1] // 2}).json()["rows"]
        causes = list(client.get("runs/0/causes").json()["causes"])
        total = client.get("runs/0/trajectories", params={"limit": 1}).json()["total"]

        def a_group() -> str:
            step = rng.choice(steps[:-1] or steps)  # the last step may be short
            return f"runs/0/steps/{step}/groups/{rng.randrange(16)}"

        cases: dict[str, Any] = {
            "runs (the live poll)": lambda: "runs",
            "overview": lambda: "runs/0/overview",
            "step (its groups)": lambda: f"runs/0/steps/{rng.choice(steps)}",
            "group (its runs, advantages)": a_group,
            "run (as ART trains on it)": lambda: f"runs/0/trajectories/{rng.choice(some)['id']}",
            "causes": lambda: "runs/0/causes",
            "find: first page": lambda: ("runs/0/trajectories", {}),
            "find: a cause": lambda: ("runs/0/trajectories", {"cause": rng.choice(causes)}),
            "find: a rare word": lambda: (
                "runs/0/trajectories",
                {"text": f"mal{rng.randrange(200, 400)}"},
            ),
            "find: reward >= 1, best first": lambda: (
                "runs/0/trajectories",
                {"min_reward": 1, "order": "-reward"},
            ),
            "find: a deep page": lambda: (
                "runs/0/trajectories",
                {"offset": rng.randrange(total // 2, total - 50)},
            ),
        }
        out = {}
        for name, make in cases.items():
            times = []
            for _ in range(repeat):
                target = make()
                path, params = target if isinstance(target, tuple) else (target, {})
                started = time.perf_counter()
                answer = client.get(path, params=params)
                times.append((time.perf_counter() - started) * 1000)
                assert answer.status_code == 200, (path, answer.text[:300])
            out[name] = quantiles(times)
    return out


def pages(base: str, repeat: int, rng: random.Random) -> dict[str, dict[str, float]]:
    from browser import chromium

    with httpx.Client(base_url=base + "api/", timeout=60) as client:
        steps = client.get("runs/0/overview").json()["steps"]["step"]
        some = client.get("runs/0/trajectories", params={"step": steps[-1] // 2}).json()["rows"]
    routes: dict[str, Any] = {
        "overview": lambda: "#/",
        "step": lambda: f"#/r/0/step/{rng.choice(steps)}",
        "group": lambda: f"#/r/0/step/{rng.choice(steps[:-1])}/group/{rng.randrange(16)}",
        "run": lambda: f"#/r/0/run/{rng.choice(some)['id']}",
        "find": lambda: f"#/find?run=0&text=mal{rng.randrange(200, 400)}",
    }
    out: dict[str, dict[str, float]] = {}
    with chromium() as context:
        page = context.new_page()  # type: ignore[attr-defined]
        page.goto(base)  # the static files, once (a browser keeps them)
        page.wait_for_function("document.body.dataset.ready === 'overview'")
        for name, route in routes.items():
            opened, followed, seen = [], [], []
            for k in range(repeat):
                page.goto("about:blank")
                started = time.perf_counter()
                page.goto(base + route())
                page.wait_for_function(f"document.body.dataset.ready === {name!r}")
                seen.append((time.perf_counter() - started) * 1000)
                opened.append(float(page.evaluate("document.body.dataset.drawnMs")))
                token = page.evaluate("document.body.dataset.rendered")
                started = time.perf_counter()
                target = route()  # a new hash each time (an unknown field, ignored)
                target += f"{'&' if '?' in target else '?'}round={k}"
                page.evaluate(f"location.hash = {target!r}")
                page.wait_for_function(f"document.body.dataset.rendered !== {token!r}")
                followed.append(float(page.evaluate("document.body.dataset.drawnMs")))
            out[f"{name}: opened (load, ask, draw)"] = quantiles(opened)
            out[f"{name}: followed (a link in the app)"] = quantiles(followed)
            out[f"{name}: opened, as Playwright waits"] = quantiles(seen)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--tokens", type=int, default=1000, help="tokens per run (about)")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/bench_viewer"))
    parser.add_argument("--repeat", type=int, default=50, help="rounds per API call")
    parser.add_argument("--page-repeat", type=int, default=10, help="rounds per page")
    parser.add_argument("--keep", action="store_true", help="keep the folder afterwards")
    parser.add_argument(
        "--keep-index", action="store_true", help="use the folder's index from an earlier run"
    )
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        serve(args.child)
        return
    folder = args.dir / f"run-{args.runs}"
    if not (folder / "metrics.jsonl").exists():
        started = time.perf_counter()
        figures = write_run(folder, args.runs, args.tokens)
        print(f"wrote {args.runs} runs in {time.perf_counter() - started:.0f} s: {figures}")
    if not args.keep_index:
        for index in folder.glob(".arttrace-index.sqlite*"):
            index.unlink()  # the viewer builds its index, as on a run it never saw
    launched = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, __file__, "--child", str(folder)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        base = child.stdout.readline().strip()
        serving = time.perf_counter() - launched
        with httpx.Client(timeout=60) as client:
            while client.get(base + "api/runs").json()["runs"][0]["state"] != "ready":
                time.sleep(0.2)
        ready = time.perf_counter() - launched
        print(
            f"viewer serving after {serving:.1f} s; the folder indexed, ready after {ready:.1f} s"
        )
        print(f"viewer memory after indexing: {memory(child.pid)}")
        before = cpu_seconds(child.pid)
        time.sleep(10)
        idle = (cpu_seconds(child.pid) - before) / 10
        print(f"viewer idle (refreshing every 0.5 s, nothing new): {100 * idle:.1f}% of a core")
        print(f"machine load average (1, 5, 15 min): {os.getloadavg()}")
        rng = random.Random(0)
        results = {"api": api(base, args.repeat, rng), "pages": pages(base, args.page_repeat, rng)}
        for part, rows in results.items():
            print(f"\n{part} (ms)            p50      p99      max")
            for name, q in rows.items():
                print(f"  {name:<44} {q['p50_ms']:7.1f}  {q['p99_ms']:7.1f}  {q['max_ms']:7.1f}")
        used = memory(child.pid)
        rss, peak = used["VmRSS"], used["VmHWM"]
        print(f"machine load average (1, 5, 15 min) at the end: {os.getloadavg()}")
        print(f"\nviewer memory after browsing: RSS {rss:.0f} MiB, peak {peak:.0f} MiB")
        print(json.dumps({**results, "memory_mb": used}))
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.wait(timeout=30)
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
