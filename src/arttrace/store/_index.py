"""The index: one SQLite file per run folder, grown by each refresh from where the last one
stopped, in each journal file.

Why it stays right with writers and readers at work:

- **Appends**: a file's indexed part is ``(offset, lines)``; a refresh reads whole lines from
  there. A line without its newline (being written, or cut short by a crash) is left for a
  later refresh, never indexed half. The store never writes into the run's files.
- **Several processes**: each refresh batch is one ``BEGIN IMMEDIATE`` transaction that
  re-reads the file's offset inside it, so two processes indexing one folder take turns and
  never index a line twice. WAL lets readers (the viewer) read while a batch is written.
- **Killed mid-refresh**: a batch commits whole or not at all (its rows and the file's new
  offset together); the next refresh goes on from the last committed batch.
- **Replaced files**: a followed file that shrank below its offset, changed its first bytes
  or vanished (the Trainer moves a step's runs aside when none can train) makes the index
  start over, as does an index of another schema version (``PRAGMA user_version``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import ConfigurationError, JournalError
from .._journal import damaged, parse_line
from . import _scan
from ._rows import Kind

SCHEMA_VERSION = 4
"""Bumped whenever the tables change: an index of another version is rebuilt."""
INDEX_NAME = ".arttrace-index.sqlite"
BATCH_LINES = 1000
BATCH_BYTES = 32 << 20
"""A batch (one transaction) reads at most this many lines or about this many bytes: short
enough that another process waiting for the write lock is not kept waiting long."""
HEAD = 4096
"""Bytes at the start of a followed file whose hash tells the same file from a replaced one."""
LINE_BITS = 26
"""A journal line's id is ``(step * 2 + set_aside) << LINE_BITS | line``: stable through a
rebuild, and below 2**53 (JavaScript's exact integers) up to step 2**26."""

_SCHEMA = """
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE files(
    id INTEGER PRIMARY KEY,
    path TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    step INTEGER,
    set_aside INTEGER NOT NULL,
    start INTEGER NOT NULL DEFAULT 0,
    lines INTEGER NOT NULL DEFAULT 0,
    size INTEGER NOT NULL DEFAULT 0,
    mtime_ns INTEGER NOT NULL DEFAULT 0,
    head_len INTEGER NOT NULL DEFAULT 0,
    head BLOB
);
CREATE TABLE runs(
    id INTEGER PRIMARY KEY,
    file_id INTEGER NOT NULL,
    start INTEGER NOT NULL,
    length INTEGER NOT NULL,
    line INTEGER NOT NULL,
    step INTEGER,
    position INTEGER,
    rollout INTEGER,
    set_aside INTEGER NOT NULL,
    split TEXT,
    example_id TEXT NOT NULL,
    reward REAL,
    exception_type TEXT,
    exception_message TEXT,
    policy_step INTEGER,
    calls INTEGER NOT NULL,
    trainable_turns INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    trainable_tokens INTEGER NOT NULL,
    causes TEXT NOT NULL,
    sources TEXT NOT NULL,
    started_at REAL,
    ended_at REAL,
    node_id TEXT,
    node_address TEXT,
    worker_pid INTEGER,
    policies TEXT NOT NULL,
    per_policy TEXT,
    policy_rewards TEXT
);
CREATE INDEX runs_order ON runs(step, position, rollout);
CREATE INDEX runs_reward ON runs(reward);
CREATE INDEX runs_example ON runs(example_id);
CREATE TABLE causes(cause TEXT NOT NULL, run_id INTEGER NOT NULL, PRIMARY KEY(cause, run_id))
    WITHOUT ROWID;
CREATE TABLE policies(policy TEXT NOT NULL, run_id INTEGER NOT NULL, PRIMARY KEY(policy, run_id))
    WITHOUT ROWID;
CREATE TABLE lines(
    file TEXT NOT NULL, line INTEGER NOT NULL, record TEXT NOT NULL, PRIMARY KEY(file, line)
) WITHOUT ROWID;
"""
_TEXT = {
    # Contentless (the text stays in the journal) and detail=none (which runs hold a word, not
    # where): a quarter of the size of full detail, and faster, for word search (no phrases).
    "fts5": "CREATE VIRTUAL TABLE texts USING fts5(body, content='', detail=none, "
    "tokenize='unicode61 remove_diacritics 2')",
    "like": "CREATE TABLE texts(rowid INTEGER PRIMARY KEY, body TEXT NOT NULL)",
}
SEPARATOR = "\x1f"
"""Between the causes (and sources) of a run in one column."""


@functools.cache
def fts5_available() -> bool:
    """Whether this Python's SQLite has FTS5 (else text search falls back to ``LIKE``)."""
    try:
        sqlite3.connect(":memory:").execute("CREATE VIRTUAL TABLE t USING fts5(x)")
    except sqlite3.OperationalError:
        return False
    return True


def text_mode() -> str:
    return "fts5" if fts5_available() else "like"


def cache_location(root: Path) -> Path:
    """Where the index of a folder this user cannot write goes: ``$XDG_CACHE_HOME/arttrace``
    (``~/.cache/arttrace``), keyed by the folder's real path."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    key = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:24]
    return Path(base) / "arttrace" / f"index-{key}.sqlite"


class _Replaced(Exception):
    """A followed file is no longer the one indexed: the index starts over."""


@dataclass(slots=True)
class _File:
    id: int
    start: int
    lines: int
    size: int
    mtime_ns: int
    head_len: int
    head: bytes | None


class Index:
    """The SQLite index of one run folder (see the module docstring)."""

    def __init__(self, root: Path, single_file: str | None) -> None:
        """``single_file``: the name of a saved trajectory given alone (indexed in memory)."""
        self.root, self.single_file = root, single_file
        self.mode = text_mode()
        self.location: Path | None = None
        """The index file (``None``: in memory, for a single saved trajectory)."""
        self.db: sqlite3.Connection = self._open()
        self._claims: _scan.Claims = ()
        """The policies the folder's Trainer declared, as its runs were indexed under them."""

    # -- the file --------------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        if self.single_file is not None:
            return self._ready(self._connect(":memory:"))
        for location in self._locations():
            try:
                return self._ready(self._connect_file(location))
            except OSError:  # not writable (permissions, a read-only disk), or not a file
                self._abandon()
            except sqlite3.DatabaseError as error:
                self._abandon()
                if not _read_only(error):
                    # Not an index this SQLite can use (damaged, or FTS5 tables from a build
                    # that has it): ours, so it is built again from the journal.
                    _remove(location)
                    return self._ready(self._connect_file(location))
        raise ConfigurationError(
            f"cannot write an index for {self.root}, in the folder or in "
            f"{cache_location(self.root)}: make one of them writable (XDG_CACHE_HOME moves "
            "the cache)"
        )

    def _abandon(self) -> None:
        db = getattr(self, "db", None)
        if db is not None:
            with contextlib.suppress(sqlite3.Error):
                db.close()
        self.location = None

    def _locations(self) -> Iterator[Path]:
        inside = self.root / INDEX_NAME
        if os.access(self.root, os.W_OK) and (not inside.exists() or os.access(inside, os.W_OK)):
            yield inside
        cached = cache_location(self.root)
        try:
            cached.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError:
            return
        yield cached

    def _connect_file(self, location: Path) -> sqlite3.Connection:
        # It holds the runs' text: the user's only, as the journal is (SQLite gives its -wal
        # and -shm files the database's permissions).
        os.close(os.open(location, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
        db = self._connect(str(location))
        try:
            db.execute("PRAGMA journal_mode=WAL")
        except BaseException:
            db.close()
            raise
        self.location = location
        return db

    @staticmethod
    def _connect(target: str) -> sqlite3.Connection:
        # Autocommit: every write is in an explicit BEGIN IMMEDIATE ... COMMIT (see _write).
        db = sqlite3.connect(target, timeout=60, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA synchronous=NORMAL")  # an index is rebuilt, never lost: no fsync
        db.execute("PRAGMA cache_size=-16384")  # 16 MiB: bounded whatever the run's size
        return db

    def _ready(self, db: sqlite3.Connection) -> sqlite3.Connection:
        """``db`` with this version's tables (made, or rebuilt from another version's)."""
        self.db = db
        if self._current():
            return db
        with self._write():
            if not self._current():  # another process may have made it meanwhile
                self._create()
        return db

    def _current(self) -> bool:
        (version,) = self.db.execute("PRAGMA user_version").fetchone()
        if version != SCHEMA_VERSION:
            return False
        row = self.db.execute("SELECT value FROM meta WHERE key = 'text'").fetchone()
        return row is not None and row[0] == self.mode

    def _create(self) -> None:
        """Drop whatever is there and make empty tables (inside a write transaction)."""
        names = self.db.execute(
            "SELECT type, name FROM sqlite_master WHERE type IN ('table', 'view') "
            "AND name NOT LIKE 'sqlite_%' AND name NOT LIKE 'texts_%'"
        ).fetchall()
        for kind, name in names:
            self.db.execute(f'DROP {kind.upper()} IF EXISTS "{name}"')
        for statement in [*_SCHEMA.split(";"), _TEXT[self.mode]]:
            if statement.strip():
                self.db.execute(statement)
        self.db.execute("INSERT INTO meta VALUES ('text', ?)", (self.mode,))
        self.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @contextlib.contextmanager
    def _write(self) -> Iterator[None]:
        """One transaction holding the write lock from its start: whole or not at all."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def close(self) -> None:
        self.db.close()

    # -- refreshing ------------------------------------------------------------------------

    def refresh(self, kind: Kind) -> tuple[int, list[str]]:
        """Index what was appended since: ``(new runs, problems)``. A damaged journal line is
        a :class:`JournalError` naming it, raised once every other file is indexed; a saved
        file that is no trajectory is a problem (said, and left out)."""
        for _ in range(3):
            try:
                return self._refresh(kind)
            except _Replaced:
                with self._write():
                    self._create()
        return self._refresh(kind)

    def _refresh(self, kind: Kind) -> tuple[int, list[str]]:
        known = self._files()
        self._claims = _scan.claims([] if self.single_file else _scan.declared(self.root))
        indexed_under = self.db.execute("SELECT value FROM meta WHERE key = 'claims'").fetchone()
        if indexed_under is None or indexed_under[0] != json.dumps(self._claims):
            if known:  # indexed before its Trainer declared these policies: index it anew
                raise _Replaced
            with self._write():
                self.db.execute(
                    "INSERT OR REPLACE INTO meta VALUES ('claims', ?)", (json.dumps(self._claims),)
                )
        found = _scan.sources(self.root, kind, self.single_file)
        if known.keys() - {s.path for s in found}:
            raise _Replaced  # a followed file left its place (moved aside, deleted)
        new, problems, damage = 0, list[str](), list[str]()
        root = str(self.root)
        unchanged: set[int | None] = set()
        """Steps whose rollouts file is as indexed: no file was moved aside there."""
        for source in found:
            seen = known.get(source.path)
            if source.set_aside and seen is None and source.step in unchanged:
                continue  # only the Trainer's rename makes this file, which changes the other
            try:  # a string, not a Path: this loop runs for every file at every refresh
                stat = os.stat(os.path.join(root, source.path))
            except FileNotFoundError:
                if seen is not None:
                    raise _Replaced from None
                continue
            if seen is not None and (stat.st_size, stat.st_mtime_ns) == (seen.size, seen.mtime_ns):
                if source.kind == "rollouts" and not source.set_aside:
                    unchanged.add(source.step)
                continue  # unchanged since the last refresh: nothing to read
            path = self.root / source.path
            try:
                if source.kind == "saved":
                    new += self._index_saved(source, path)
                else:
                    new += self._index_lines(source, path)
            except JournalError as error:
                (damage if source.kind != "saved" else problems).append(str(error))
        if damage:
            more = f" ({len(damage) - 1} more damaged files)" if len(damage) > 1 else ""
            raise JournalError(damage[0] + more)
        return new, problems

    def _files(self) -> dict[str, _File]:
        rows = self.db.execute(
            "SELECT path, id, start, lines, size, mtime_ns, head_len, head FROM files"
        )
        return {path: _File(*rest) for path, *rest in rows}

    def _file(self, source: _scan.Source) -> _File:
        """The file's row (made if new), read inside the caller's write transaction."""
        row = self.db.execute(
            "SELECT id, start, lines, size, mtime_ns, head_len, head FROM files WHERE path = ?",
            (source.path,),
        ).fetchone()
        if row is not None:
            return _File(*row)
        cursor = self.db.execute(
            "INSERT INTO files(path, kind, step, set_aside) VALUES (?, ?, ?, ?)",
            (source.path, source.kind, source.step, int(source.set_aside)),
        )
        assert cursor.lastrowid is not None
        return _File(cursor.lastrowid, 0, 0, 0, 0, 0, None)

    def _index_lines(self, source: _scan.Source, path: Path) -> int:
        """Index ``path``'s new whole lines, a batch per transaction."""
        new = 0
        while True:
            with self._write():
                file = self._file(source)
                stat = os.stat(path)
                if stat.st_size < file.start or not _same_head(path, file):
                    raise _Replaced
                added, more, damage = self._batch(source, path, file)
                head_len = min(file.start, HEAD)
                self.db.execute(
                    "UPDATE files SET start = ?, lines = ?, size = ?, mtime_ns = ?, "
                    "head_len = ?, head = ? WHERE id = ?",
                    (
                        file.start,
                        file.lines,
                        -1 if more or damage else stat.st_size,  # -1: read it again
                        stat.st_mtime_ns,
                        head_len if file.head_len == 0 else file.head_len,
                        _hash(path, head_len) if file.head_len == 0 else file.head,
                        file.id,
                    ),
                )
            new += added
            if damage is not None:
                raise damage
            if not more:
                return new

    def _batch(
        self, source: _scan.Source, path: Path, file: _File
    ) -> tuple[int, bool, JournalError | None]:
        """Index up to a batch of lines from ``file.start`` (advancing it): ``(runs added,
        more lines may follow, the damage met)``."""
        added = read = 0
        for number, start, line in _scan.whole_lines(
            path, file.start, file.lines, BATCH_LINES, BATCH_BYTES
        ):
            read += 1
            try:
                record = parse_line(path, number, line)
                if record is not None:
                    if source.kind == "rollouts":
                        added += self._add_rollout(source, path, file, number, start, line, record)
                    elif source.kind == "group_rewards":
                        self._judged(source, path, number, record)
                    else:
                        self.db.execute(
                            "INSERT OR REPLACE INTO lines VALUES (?, ?, ?)",
                            (source.kind, number, line.decode()),
                        )
            except JournalError as error:
                return added, False, error
            file.start, file.lines = start + len(line), number
        return added, read >= BATCH_LINES, None

    def _judged(
        self, source: _scan.Source, path: Path, number: int, record: dict[str, object]
    ) -> None:
        """A group reward line: its runs' rewards become the judge's (what they trained on).
        The Trainer writes it once its runs' lines are whole, and a step's rollouts are indexed
        before its group rewards, so its runs are indexed by now; a run run again since (a
        step set aside) started at another time and keeps its own reward. A line of a judge
        that failed changes nothing."""
        if "error" in record:
            return
        try:
            position = int(record["group"])  # type: ignore[call-overload]
            runs = record["runs"]
            rewards = record["rewards"]
            assert isinstance(runs, list) and isinstance(rewards, list)
            pairs = [
                (int(k), started, *_judged_reward(r))
                for (k, started), r in zip(runs, rewards, strict=True)
            ]
        except (KeyError, TypeError, ValueError, AssertionError) as error:
            raise damaged(path, number, f"not a group reward ({error!r})") from None
        self.db.executemany(
            "UPDATE runs SET reward = ?, policy_rewards = ? "
            "WHERE step = ? AND position = ? AND rollout = ? AND started_at IS ?",
            [
                (reward, per_policy, source.step, position, k, started)
                for k, started, reward, per_policy in pairs
            ],
        )

    def _add_rollout(
        self,
        source: _scan.Source,
        path: Path,
        file: _File,
        number: int,
        start: int,
        line: bytes,
        record: dict[str, object],
    ) -> int:
        position, rollout, data = _scan.rollout(path, number, record)
        try:
            figures = _scan.figures(data, self._claims)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise damaged(path, number, f"not a trajectory ({error!r})") from None
        assert source.step is not None
        if number >> LINE_BITS:
            raise JournalError(
                f"{path} has more than {1 << LINE_BITS} lines, more than the index numbers in "
                "one step: split the run's steps (a gateway: open runs with a later step)"
            )
        row_id = ((source.step * 2 + source.set_aside) << LINE_BITS) | number
        self._insert(row_id, file.id, start, len(line), number, source, position, rollout, figures)
        return 1

    def _index_saved(self, source: _scan.Source, path: Path) -> int:
        """Index a saved trajectory (whole, or not at all: a file being written is retried)."""
        data = path.read_bytes()
        trajectory = _scan.saved(path, data)
        try:
            figures = _scan.figures(trajectory)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise JournalError(f"{path} is not a saved trajectory ({error!r})") from None
        stat = os.stat(path)
        with self._write():
            file = self._file(source)
            if file.start:  # indexed before: by another process now, or changed since
                if (file.size, file.mtime_ns) == (stat.st_size, stat.st_mtime_ns):
                    return 0
                raise _Replaced  # rewritten (Trajectory.save again): start over
            self._insert(file.id, file.id, 0, len(data), 1, source, None, None, figures)
            self.db.execute(
                "UPDATE files SET start = ?, lines = 1, size = ?, mtime_ns = ?, head_len = ?, "
                "head = ? WHERE id = ?",
                (len(data), stat.st_size, stat.st_mtime_ns, 0, None, file.id),
            )
        return 1

    def _insert(
        self,
        row_id: int,
        file_id: int,
        start: int,
        length: int,
        line: int,
        source: _scan.Source,
        position: int | None,
        rollout: int | None,
        f: _scan.Figures,
    ) -> None:
        self.db.execute(
            "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
            "?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                row_id,
                file_id,
                start,
                length,
                line,
                source.step,
                position,
                rollout,
                int(source.set_aside),
                f.split,
                f.example_id,
                f.reward,
                f.exception_type,
                f.exception_message,
                f.policy_step,
                f.calls,
                f.trainable_turns,
                f.completion_tokens,
                f.trainable_tokens,
                SEPARATOR.join(f.causes),
                SEPARATOR.join(f.sources),
                f.started_at,
                f.ended_at,
                f.node_id,
                f.node_address,
                f.worker_pid,
                SEPARATOR.join(f.policies),
                _json(f.per_policy),
                _json(f.policy_rewards),
            ),
        )
        self.db.executemany("INSERT INTO causes VALUES (?, ?)", [(c, row_id) for c in f.causes])
        self.db.executemany("INSERT INTO policies VALUES (?, ?)", [(p, row_id) for p in f.policies])
        if f.text:
            self.db.execute("INSERT INTO texts(rowid, body) VALUES (?, ?)", (row_id, f.text))


def _judged_reward(value: Any) -> tuple[float, str | None]:
    """A judge's reward for one run: a number, or one per policy (``{policy: reward}``, the
    run's reward then their mean, as ``Trajectory.policy_rewards`` sets it)."""
    if isinstance(value, dict):
        rewards = {str(k): float(v) for k, v in value.items()}
        if not rewards:
            raise ValueError("an empty mapping of policy rewards")
        return math.fsum(rewards.values()) / len(rewards), _json(rewards)
    return float(value), None


def _json(value: dict[str, Any]) -> str | None:
    """A run's per-policy figures as JSON text; ``None`` (most runs: one policy) when empty."""
    return json.dumps(value, separators=(",", ":")) if value else None


def _hash(path: Path, length: int) -> bytes | None:
    if length == 0:
        return None
    with open(path, "rb") as file:
        return hashlib.sha256(file.read(length)).digest()


def _same_head(path: Path, file: _File) -> bool:
    """Whether ``path`` starts as the file indexed so far did (the same file, grown)."""
    return file.head_len == 0 or _hash(path, file.head_len) == file.head


def _read_only(error: sqlite3.DatabaseError) -> bool:
    text = str(error)
    return "readonly" in text or "read-only" in text or "unable to open" in text


def _remove(location: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(f"{location}{suffix}")
