"""Small things many tests use: the add tool's schema; a block in which any warning fails."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    }
]


@contextlib.contextmanager
def warnings_are_errors() -> Iterator[None]:
    """Any warning given in the block fails the test (nothing of arttrace's may reach the
    caller), except a ResourceWarning: the garbage collector may collect an earlier test's
    leftover socket during the block, which is not the block's doing (ignored, as Python's
    default filters do)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", ResourceWarning)
        yield
