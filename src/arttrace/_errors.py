"""The errors arttrace raises on purpose, under one base class.

Each also keeps the built-in class it was before the hierarchy existed (``ValueError`` for bad
input, ``RuntimeError`` for a state that cannot go on), so ``except ValueError`` still works.
"""

from __future__ import annotations


class ArttraceError(Exception):
    """Base class of every error arttrace raises on purpose."""


class ConfigurationError(ArttraceError, ValueError):
    """An argument, reward, metadata value or dataset arttrace cannot use; the message says
    what was wrong and what to do."""


class UsageError(ArttraceError, RuntimeError):
    """An API used where it cannot work (no trajectory active, a trajectory entered twice)."""


class TrainingError(ArttraceError, RuntimeError):
    """A step could not complete; what it had finished is in the journal (``resume=True``)."""
