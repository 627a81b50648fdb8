"""``arttrace gateway``: the gateway as a process of its own, for agents you start yourself.

Open a run over HTTP, give its URL to the agent as its OpenAI base URL, set the reward, close
the run: each closed run is appended to the training journal under ``--out``, the format the
``Trainer`` resumes from. Keys come from the environment, not the command line (which any
user of the machine can read): ``ARTTRACE_GATEWAY_TOKEN``, ``ARTTRACE_UPSTREAM_API_KEY``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

_EPILOG = """\
the run API (JSON):
  POST /runs {"example_id": "q-1", "metadata": {...}, "step": 0}  -> {"run_id", "url", ...}
  GET  /runs/ID                     the run's calls so far
  PUT  /runs/ID/reward {"reward": 1.0}
  POST /runs/ID/close               journals the run; its URL stops working
A run's "url" is an OpenAI base URL: give it to the agent (OPENAI_BASE_URL).
"""


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown after each option's help; the description keeps its line breaks."""


def add_parser(subparsers: Any) -> None:
    """Register ``gateway`` on the ``arttrace`` command's subparsers."""
    parser = subparsers.add_parser(
        "gateway",
        help="serve an OpenAI-compatible gateway in front of a policy server: each run gets "
        "a URL, and every call made to it is recorded for training",
        description="Serve an OpenAI-compatible gateway in front of a policy server, for agents "
        "you start yourself. Open a run over HTTP, give its URL to the agent as its OpenAI base "
        "URL, set the reward, close the run: each closed run is appended to the training "
        "journal under --out, which the Trainer resumes from. Keys come from the environment, "
        "not the command line: ARTTRACE_GATEWAY_TOKEN (callers must present it), "
        "ARTTRACE_UPSTREAM_API_KEY (sent to the upstream).",
        epilog=_EPILOG,
        formatter_class=_Formatter,
    )
    parser.add_argument(
        "--upstream",
        required=True,
        help="the policy server's OpenAI base URL, e.g. http://127.0.0.1:8000/v1",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8787, help="port (0: any free port)")
    parser.add_argument(
        "--out", type=Path, default=Path("runs/gateway"), help="where closed runs are journaled"
    )
    parser.add_argument(
        "--no-training-data",
        action="store_true",
        help="do not ask the upstream for logprobs and token ids (runs will not train)",
    )
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds an upstream call may take"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    """Serve until interrupted (Ctrl-C or SIGTERM)."""
    from ..gateway import Gateway

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    gateway = Gateway(
        args.upstream,
        host=args.host,
        port=args.port,
        token=os.environ.get("ARTTRACE_GATEWAY_TOKEN") or None,
        upstream_api_key=os.environ.get("ARTTRACE_UPSTREAM_API_KEY") or None,
        request_training_data=not args.no_training_data,
        out=args.out,
        timeout=args.timeout,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with gateway:
        print(
            f"arttrace gateway: listening on {gateway.base_url} (POST /runs to open a run), "
            f"upstream {gateway.upstream}, runs journaled in {args.out / 'journal'}",
            flush=True,
        )
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: stop
            stop.wait()
    print("arttrace gateway: stopped", flush=True)
    return 0
