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


class RolloutTimeoutError(ArttraceError, TimeoutError):
    """A run took longer than the Trainer's ``rollout_timeout`` and was stopped. Never raised
    to the caller: it is the run's ``exception`` (counted under ``max_exceptions``), and the
    message says how long, what the run had recorded and what to do."""


class ResumeError(ConfigurationError):
    """``resume=True`` with settings that differ from the run's saved ones (seed, dataset,
    group size, ...): resuming would group runs under the wrong examples. The message names
    each difference."""


class RunLockedError(UsageError):
    """Another Trainer, in this process or another, is working in the run folder; the
    message names the folder and the holder's PID."""


class JournalError(ArttraceError, ValueError):
    """A file in the run folder is damaged where no crash damages it (a line other than the
    last, a file written whole); the message names the file and line and what to do."""
