"""What an export did, and the file it writes: whole or not at all, readable by its owner only
(it holds prompts and answers, as the journal does)."""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from .._errors import ArttraceError


@dataclass(slots=True)
class ExportSummary:
    """``rows`` written (SFT lines, table rows, spans) from ``runs`` runs; ``skipped``: runs
    left out, by reason; ``bytes`` of the file (``None`` for spans sent)."""

    format: str
    destination: str
    rows: int = 0
    runs: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    bytes: int | None = None
    seconds: float = 0.0

    def line(self) -> str:
        """One line: what was written where, and the runs skipped, by reason."""
        what = {"sft": "conversations", "parquet": "rows", "otlp": "spans"}[self.format]
        size = "" if self.bytes is None else f", {_size(self.bytes)}"
        verb = "sent" if self.format == "otlp" else "wrote"
        skipped = (
            "; skipped " + ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()))
            if self.skipped
            else "; no run skipped"
        )
        return (
            f"arttrace export: {verb} {self.rows} {what} from {self.runs} runs to "
            f"{self.destination}{size} in {self.seconds:.1f} s{skipped}"
        )


def _size(n: int) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    raise AssertionError  # pragma: no cover


@contextlib.contextmanager
def private_file(path: Path) -> Iterator[BinaryIO]:
    """``path`` written under a temporary name, for its owner only, and renamed into place
    when the block ends without an error (an export that fails leaves no half file)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        with open(fd, "wb") as file:
            yield file
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def check_out(path: Path, suffix: str | None = None) -> str | None:
    """Why ``path`` cannot take an export, or ``None``."""
    if suffix is not None and path.suffix != suffix:
        return f"--out must end in {suffix}, got {path}"
    if path.is_dir():
        return f"--out {path} is a folder: give a file name"
    if not path.parent.is_dir():
        return f"--out {path}: its folder {path.parent} does not exist"
    return None


class ExportError(ArttraceError, RuntimeError):
    """An export could not complete (the OTLP endpoint refused a batch); the message says how
    far it got and what to check."""
