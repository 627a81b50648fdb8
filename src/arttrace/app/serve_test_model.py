"""``arttrace serve-test-model``: a scripted vLLM-compatible model on 127.0.0.1, so the
docs' examples (and a first agent) run with no model server of your own.

It is :func:`arttrace.testing.serve` with :func:`quiz_model`: answers come with logprobs and
token ids as vLLM returns them, so every policy turn is trainable. The model knows a few facts
(capitals, small sums) and gets each question right every other time it is asked, so the runs
of one example earn different rewards and a GRPO step has something to ship; anything else it
echoes. Point ``OPENAI_BASE_URL`` at the URL it prints.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import signal
import threading
from collections import Counter
from typing import TYPE_CHECKING, Any

from ._args import add_command, port

if TYPE_CHECKING:  # arttrace.testing loads httpx: not on every `arttrace` command's way
    from ..testing import Reply, ScriptedLLM

CAPITALS = {
    "france": ("Paris", "Lyon"),
    "italy": ("Rome", "Milan"),
    "spain": ("Madrid", "Barcelona"),
    "germany": ("Berlin", "Munich"),
    "japan": ("Tokyo", "Osaka"),
    "canada": ("Ottawa", "Toronto"),
    "australia": ("Canberra", "Sydney"),
}
"""What the quiz model knows: each country's capital, and the city it names when wrong."""

_CAPITAL = re.compile(r"capital of (\w+)", re.IGNORECASE)
_SUM = re.compile(r"(-?\d+)\s*\+\s*(-?\d+)")
DEFAULT_PORT = 8000
"""vLLM's own default, so a URL written for a local vLLM reaches the test model unchanged."""


def quiz_model() -> ScriptedLLM:
    """The scripted model behind ``arttrace serve-test-model``.

    A question about a capital in :data:`CAPITALS`, or a sum ``a + b``, is answered right the
    first time it is asked, wrong the second, and so on (each of ``n`` choices counts as one
    ask): a group of runs of one example gets rewards that differ whatever order its requests
    arrive in, which is what GRPO learns from. Any other message is echoed (``"You said:
    ..."``).
    """
    from ..testing import Reply, ScriptedLLM, echo

    asked: Counter[str] = Counter()
    lock = threading.Lock()

    def question(text: str) -> tuple[str, str, str] | None:
        """``(what is asked, right answer, wrong answer)``, or None for anything else."""
        if (capital := _CAPITAL.search(text)) and capital[1].lower() in CAPITALS:
            country = capital[1].title()
            right, wrong = CAPITALS[country.lower()]
            said = f"The capital of {country} is {{}}."
            return country, said.format(right), said.format(wrong)
        if total := _SUM.search(text):
            value = int(total[1]) + int(total[2])
            return (
                f"{total[1]}+{total[2]}",
                f"The answer is {value}.",
                f"The answer is {value + 1}.",
            )
        return None

    def respond(request: dict[str, Any]) -> list[Reply]:
        users = [m for m in request.get("messages") or [] if m.get("role") == "user"]
        text = users[-1].get("content") if users else None
        n = int(request.get("n") or 1)
        known = question(text) if isinstance(text, str) else None
        if known is None:
            return [echo(request)] * n
        key, right, wrong = known
        with lock:
            first = asked[key]
            asked[key] += n
        return [Reply(right if (first + k) % 2 == 0 else wrong) for k in range(n)]

    return ScriptedLLM(respond)


# -- the command -----------------------------------------------------------------------------


def add_parser(subparsers: Any) -> None:
    """Register ``serve-test-model`` on the ``arttrace`` command's subparsers."""
    parser = add_command(
        subparsers,
        "serve-test-model",
        "serve a scripted vLLM-like model on 127.0.0.1, to run the docs' examples with no "
        "model server of your own",
        "Serve arttrace's scripted vLLM-compatible model (arttrace.testing) on "
        "127.0.0.1 until Ctrl-C: Chat Completions, Responses and Completions, with logprobs "
        "and token ids as vLLM returns them. It knows a few capitals and small sums and gets "
        "each question right every other time, so the runs of one example earn different "
        "rewards; anything else it echoes. Point OPENAI_BASE_URL at the URL it prints "
        "(OPENAI_API_KEY may be anything).",
    )
    parser.add_argument(
        "--port", type=port, default=DEFAULT_PORT, help="port to listen on (0: any free port)"
    )
    parser.set_defaults(run=lambda args, _top: run(args, parser))  # errors show this usage


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Serve until interrupted (Ctrl-C or SIGTERM)."""
    from ..testing import LLMServer

    try:
        server = LLMServer(quiz_model(), args.port)
    except OSError as error:
        parser.error(
            f"cannot listen on 127.0.0.1:{args.port} ({error.strerror or error}): "
            "pick another --port (0: any free port)"
        )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with server:
        print(
            f"arttrace serve-test-model: serving on {server.base_url} (Ctrl-C stops it)\n"
            f"  export OPENAI_BASE_URL={server.base_url} OPENAI_API_KEY=test",
            flush=True,
        )
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()
    print("arttrace serve-test-model: stopped", flush=True)
    return 0
