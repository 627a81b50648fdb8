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
import sys
import threading
from pathlib import Path
from typing import Any

from ..capture._context import TRANSLATABLE
from ..gateway import _options
from ._args import add_command, checked, listen_fix, port

_EPILOG = """\
the run API (JSON):
  POST /runs {"example_id": "q-1", "metadata": {...}, "step": 0}  -> {"run_id", "url", ...}
  GET  /runs/ID                     the run's calls so far
  PUT  /runs/ID/reward {"reward": 1.0}   (or one per policy: {"reward": {"planner": 1.0}})
  POST /runs/ID/close               journals the run; its URL stops working
A run's "url" is an OpenAI base URL: give it to the agent (OPENAI_BASE_URL).
"""


def add_parser(subparsers: Any) -> None:
    """Register ``gateway`` on the ``arttrace`` command's subparsers."""
    parser = add_command(
        subparsers,
        "gateway",
        "serve an OpenAI-compatible gateway in front of a policy server: each run gets "
        "a URL, and every call made to it is recorded for training",
        "Serve an OpenAI-compatible gateway in front of a policy server, for agents "
        "you start yourself. Open a run over HTTP, give its URL to the agent as its OpenAI base "
        "URL, set the reward, close the run: each closed run is appended to the training "
        "journal under --out, which the Trainer resumes from. Keys come from the environment, "
        "not the command line: ARTTRACE_GATEWAY_TOKEN (callers must present it), "
        "ARTTRACE_UPSTREAM_API_KEY (sent to the upstream).",
        _EPILOG,
    )
    parser.add_argument(
        "--upstream",
        required=True,
        type=checked(str, _options.upstream_problem),
        help="the policy server's OpenAI base URL, e.g. http://127.0.0.1:8000/v1",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--port",
        type=port,
        default=8787,
        help="port (0: any free port)",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("runs/gateway"), help="where closed runs are journaled"
    )
    parser.add_argument(
        "--no-training-data",
        action="store_true",
        help="do not ask the upstream for logprobs and token ids (runs will not train)",
    )
    parser.add_argument(
        "--timeout",
        type=checked(float, _options.timeout_problem),
        default=600.0,
        help="seconds an upstream call may take",
    )
    allowed = {  # who may call the gateway without its token: repeatable lists
        ("--allow-host", "NAME", _options.host_problem): "another name callers reach the "
        "gateway by (repeatable; '*': any). Without a token, a request for any other Host is "
        "refused, so a web page cannot reach it by DNS rebinding (default: its own address; "
        "localhost too on a loopback address)",
        ("--allow-origin", "ORIGIN", _options.origin_problem): "a web page that may call the "
        "gateway, e.g. http://localhost:3000 (repeatable; '*': any). Without a token, "
        "browsers' requests from other sites are refused (default: none)",
    }
    for (flag, metavar, problem), text in allowed.items():
        parser.add_argument(
            flag, action="append", type=checked(str, problem), metavar=metavar, help=text
        )
    parser.add_argument(
        "--translate",
        default=None,
        type=checked(str, _translate_problem),
        metavar="APIS",
        help="serve these protocols through the upstream's Chat Completions, so every turn "
        "trains with exact tokens: 'responses', 'messages' or 'responses,messages' (default: "
        "forward them as they are; a run can choose its own in POST /runs)",
    )
    parser.add_argument(
        "--workers",
        type=checked(int, _workers_problem),
        default=1,
        metavar="N",
        help="processes serving the gateway (one core each; Linux and macOS): they share the "
        "port, any of them serves any run, and worker i journals under OUT/worker-i",
    )
    parser.set_defaults(run=run)


def _translate_problem(value: str) -> str | None:
    names = {n.strip().lower() for n in value.split(",") if n.strip()}
    if not names or names - set(TRANSLATABLE):
        return f"must be {' or '.join(TRANSLATABLE)} or both, comma-separated; got {value!r}"
    return None


def _workers_problem(count: int) -> str | None:
    if count < 1:
        return f"must be 1 or more, got {count}"
    if count > 1 and sys.platform == "win32":
        return "must be 1 on Windows (workers share the port by inheriting its socket)"
    return None


def run(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    """Serve until interrupted (Ctrl-C or SIGTERM). A gateway that cannot start says why in
    one line, with the fix, and exits with status 2."""
    from .._errors import ArttraceError, RunLockedError
    from ..gateway import Gateway

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.workers > 1:
        return _run_workers(args)
    gateway = Gateway(
        args.upstream,
        host=args.host,
        port=args.port,
        token=os.environ.get("ARTTRACE_GATEWAY_TOKEN") or None,
        upstream_api_key=os.environ.get("ARTTRACE_UPSTREAM_API_KEY") or None,
        request_training_data=not args.no_training_data,
        out=args.out,
        timeout=args.timeout,
        allow_hosts=args.allow_host or (),
        allow_origins=args.allow_origin or (),
        translate=args.translate,
    )
    try:
        gateway.start()
    except RunLockedError:
        return _failed(
            f"{args.out} is in use by another process (a gateway or a Trainer holds its lock): "
            "stop it, or give this gateway another --out"
        )
    except (ArttraceError, OSError) as error:
        return _failed(f"{error}{listen_fix(error)}")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        print(
            f"arttrace gateway: listening on {gateway.base_url} (POST /runs to open a run), "
            f"upstream {gateway.upstream}, runs journaled in {args.out / 'journal'}",
            flush=True,
        )
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: stop
            stop.wait()
    finally:
        gateway.stop()
    print("arttrace gateway: stopped", flush=True)
    return 0


def _run_workers(args: argparse.Namespace) -> int:
    """``--workers N``: the parent of N gateway processes (``gateway._workers``)."""
    from .._errors import RunLockedError
    from ..gateway._workers import Workers

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    workers = Workers(
        args.workers,
        {
            "upstream": args.upstream,
            "host": args.host,
            "port": args.port,
            "request_training_data": not args.no_training_data,
            "out": str(args.out),
            "timeout": args.timeout,
            "allow_hosts": args.allow_host or [],
            "allow_origins": args.allow_origin or [],
            "translate": args.translate,
        },
    )
    try:
        workers.bind()
    except RunLockedError:
        return _failed(
            f"{args.out} is in use by another process (a gateway or a Trainer holds its lock): "
            "stop it, or give this gateway another --out"
        )
    except OSError as error:
        return _failed(f"cannot listen on {args.host}:{args.port}: {error}{listen_fix(error)}")
    status = 0
    try:
        workers.start()
        print(
            f"arttrace gateway: listening on {workers.base_url} with {args.workers} workers "
            f"(POST /runs to open a run), upstream {args.upstream}, runs journaled in "
            f"{args.out / 'worker-N' / 'journal'} by worker N",
            flush=True,
        )
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: stop
            status = workers.supervise(stop)
    except RuntimeError as error:
        return _failed(str(error))
    except KeyboardInterrupt:
        pass
    finally:
        workers.stop()
    print("arttrace gateway: stopped", flush=True)
    return status


def _failed(message: str) -> int:
    print(f"arttrace gateway: {message}", file=sys.stderr)
    return 2
