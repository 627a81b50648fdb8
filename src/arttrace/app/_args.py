"""What every ``arttrace`` command's parser shares: its help layout and its argument checks,
which load nothing heavy, so a bad argument is refused at once."""

from __future__ import annotations

import argparse
import errno
import textwrap
from collections.abc import Callable
from typing import Any

from ..gateway._options import port_problem


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default shown after its help; ``None`` is no default to show (a
    required option, or one whose help says what happens without it)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None else super()._get_help_string(action)


class _KeepLines(HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """The shared layout; the description (wrapped once, here) and the epilog of examples keep
    their line breaks."""


def add_command(
    subparsers: Any, name: str, summary: str, description: str, epilog: str | None = None
) -> argparse.ArgumentParser:
    """Register the command ``name`` on the ``arttrace`` command's subparsers, with the shared
    layout: ``summary`` in ``arttrace --help``, ``description`` in ``arttrace NAME --help``,
    then ``epilog`` (examples, their line breaks kept) when there is one."""
    kept = epilog is not None
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name,
        help=summary,
        description=textwrap.fill(description, 79) if kept else description,
        epilog=epilog,
        formatter_class=_KeepLines if kept else HelpFormatter,
    )
    return parser


def checked(
    kind: Callable[[str], Any], problem: Callable[[Any], str | None]
) -> Callable[[str], Any]:
    """An argument type: ``kind`` of the text, refused (one line, exit status 2) when the check
    ``problem`` finds it wrong, in the check's words."""

    def convert(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a {kind.__name__}: {text!r}") from None
        if (found := problem(value)) is not None:
            raise argparse.ArgumentTypeError(found)
        return value

    convert.__name__ = kind.__name__  # argparse names the type in its own messages
    return convert


port = checked(int, port_problem)
"""A port to listen on: 0 to 65535, 0 for any free port."""


def listen_fix(error: BaseException) -> str:
    """The fix for a server (the gateway, the viewer) that cannot listen, from the socket's
    error."""
    cause = error.__cause__ if error.__cause__ is not None else error
    if isinstance(cause, OSError) and cause.errno == errno.EADDRINUSE:
        return ". Another process listens there: choose another --port (0: any free port)"
    if isinstance(cause, OSError):
        return ". Give --host an address of this machine (127.0.0.1; 0.0.0.0 for all)"
    return ""
