"""Drivers for the Ray tests, forked from a process that has ART loaded but never joined Ray.

A fresh interpreter pays ART's import (about 20 s here) before it can drive a Trainer; a fork
of the test process would inherit its Ray connection, which a child cannot use. So the
drivers come from a multiprocessing fork server, started once, that preloads ART: each fork
starts at once, joins the cluster itself, and can be killed with SIGKILL like any driver.
"""

from __future__ import annotations

import multiprocessing
import runpy
import sys
from multiprocessing.context import ForkServerContext
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

_context: ForkServerContext | None = None


def drivers() -> ForkServerContext:
    """The fork server's context (started on first use, preloading ART and the Trainer)."""
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(["art", "arttrace.training._trainer", "openai", "ray"])
    return _context


def run_example(name: str, *argv: str) -> None:
    """``python examples/<name> ARGV...``, in this (forked) process."""
    sys.argv = [str(EXAMPLES / name), *argv]
    sys.path.insert(0, str(EXAMPLES))
    runpy.run_path(str(EXAMPLES / name), run_name="__main__")
