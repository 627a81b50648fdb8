"""``arttrace view``: the viewer as a command. Registered by ``arttrace.app.cli`` through
:func:`add_view_command`; starlette and uvicorn load only when the command runs."""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import signal
import sys
import threading
import webbrowser
from pathlib import Path
from typing import Any

from ._args import add_command, listen_fix, port

DEFAULT_PORT = 8788
_DESCRIPTION = (
    "Open a local, read-only web app over run folders: the reward per step (train and "
    "validation, several runs overlaid), the groups of each step and why some did not ship, "
    "each run as ART trains on it (its messages, tool calls and sampled tokens, trainable or "
    "context, shaded by logprob), and a search over the runs. A run in progress updates as "
    "its journal grows. RUN_DIR: a Trainer's output_dir, an `arttrace gateway --out` folder, a "
    "trajectory saved with t.save(path), or a folder of saved trajectories."
)


def add_view_command(subparsers: Any) -> None:
    """Register ``view`` on the ``arttrace`` command's subparsers."""
    parser = add_command(
        subparsers,
        "view",
        "browse run folders in a local web app: rewards, groups, each run's tokens",
        _DESCRIPTION,
    )
    parser.add_argument(
        "run_dirs",
        nargs="*",
        type=Path,
        metavar="RUN_DIR",
        help="the folders to show, overlaid (default: each folder under ./runs)",
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on; any other than this machine's loopback lets the network "
        "read the runs' prompts",
    )
    parser.add_argument("--port", type=port, default=DEFAULT_PORT, help="port (0: any free port)")
    parser.add_argument(
        "--tokenizer",
        metavar="NAME_OR_PATH",
        help="the tokenizer that gives each sampled token its text (the journal holds token "
        "ids): a folder a tokenizer was saved in, or a model name in the Hugging Face cache, "
        "never downloaded (default: each folder's own: the newest tokenizer saved in it, as "
        "the CPU backend's checkpoints are, else its runs' model when that is in the cache; "
        "else the pages show ids)",
    )
    parser.add_argument(
        "--no-browser",
        action="store_true",
        help="do not open a browser (one opens only where there is a display)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Serve until interrupted (Ctrl-C or SIGTERM). A folder that cannot be shown is shown as
    what is wrong with it, in the page; a viewer that cannot start says why, with the fix."""
    paths: list[Path] = list(args.run_dirs) or _default_folders(parser)
    try:
        from ..viewer._app import Viewer
    except ModuleNotFoundError as error:
        parser.error(f"{error}: `arttrace view` needs the view extra: pip install 'arttrace[view]'")
    decoder = None
    if args.tokenizer is not None:  # before serving: a tokenizer that cannot load is told now
        from .._tokenizers._find import TokenizerError, load_given, problem

        try:
            wrong = problem(args.tokenizer)  # no such folder, not cached: told at once
            if wrong is not None:
                raise TokenizerError(wrong)
            print(f"arttrace view: loading the tokenizer {args.tokenizer}", file=sys.stderr)
            decoder = load_given(args.tokenizer)
        except TokenizerError as error:
            print(f"arttrace view: {error}", file=sys.stderr)
            return 2
    if not _is_loopback(args.host):
        print(
            f"arttrace view: warning: listening on {args.host}, not this machine's loopback: "
            "anyone who can reach it on the network can read these runs' prompts and answers "
            "(the viewer has no login). Use --host 127.0.0.1 (the default) unless that is "
            "what you want.",
            file=sys.stderr,
            flush=True,
        )
    viewer = Viewer(paths, host=args.host, port=args.port, tokenizer=decoder)
    try:
        url = viewer.start()
    except Exception as error:  # UsageError from the server: cannot listen
        viewer.runs.stop()
        print(f"arttrace view: {error}{listen_fix(error)}", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        shown = ", ".join(str(p) for p in paths)
        print(f"arttrace view: {url} (showing {shown}; Ctrl-C to stop)", flush=True)
        if not args.no_browser and _has_display():
            with contextlib.suppress(Exception):  # no browser: the URL above is enough
                webbrowser.open(url)
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()
    finally:
        viewer.stop()
    print("arttrace view: stopped", flush=True)
    return 0


def _default_folders(parser: argparse.ArgumentParser) -> list[Path]:
    """Without RUN_DIR: each folder under ./runs (where the demo and the gateway write)."""
    runs = Path("runs")
    found = sorted(p for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []
    if not found:
        parser.error(
            "give a RUN_DIR (a Trainer's output_dir, a gateway --out folder or saved "
            "trajectories); without one the viewer shows the folders under ./runs, and there "
            "are none"
        )
    return found


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _has_display() -> bool:
    """A browser can open a window: always on macOS and Windows; on Linux and the BSDs only
    with an X or Wayland display (without one, ``webbrowser`` may start a text browser in
    this terminal)."""
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
