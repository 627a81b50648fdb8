"""The run folders a viewer shows: each opened through the run store on a thread of its own,
refreshed on a timer, and told apart when it cannot be read.

Every call to a folder's store runs on that folder's one thread: a sqlite connection belongs
to the thread that uses it, and a refresh (indexing the lines appended since the last one)
never runs at the same time as a page's query. The refresh timer runs off the request path:
a page never waits for the journal to be indexed, only for a refresh already under way.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .._errors import ConfigurationError, JournalError
from .._tokenizers._find import Decoder, Found, TokenizerError, discover, load
from ..store import RunStore, open_run

_log = logging.getLogger("arttrace")

REFRESH_SECONDS = 0.5
"""How often each folder's store indexes what its journal gained (at most)."""
RETRY_SECONDS = 2.0
"""How often a folder that could not be read is tried again (it may become a run)."""
LOOK_AGAIN_SECONDS = 10.0
"""How often a folder without a tokenizer is looked at again while it grows (a run in
progress writes its first checkpoint after its first step)."""

State = Literal["opening", "ready", "failed"]


@dataclass(frozen=True, slots=True)
class Problem:
    """Why a folder cannot be shown: what was wrong, and what to do about it."""

    message: str
    fix: str


class NotReady(Exception):
    """A query to a folder that is being indexed for the first time, or cannot be read."""

    def __init__(self, slot: RunSlot) -> None:
        super().__init__(slot.path)
        self.slot = slot


def problem_of(path: Path, error: BaseException) -> Problem:
    """The page's words for a folder that failed to open or refresh."""
    if isinstance(error, JournalError):
        return Problem(
            str(error),
            "Repair that line, restore the file from a copy, or move the file out of the "
            "folder. This page reads the folder again every few seconds, and shows the run "
            "once the file reads.",
        )
    if isinstance(error, PermissionError):
        return Problem(
            f"cannot read {error.filename or path}: permission denied",
            "arttrace writes run folders readable by their owner only (folders 0700, files "
            "0600): run `arttrace view` as the user who ran the training (or give yourself "
            "read access to the folder).",
        )
    if isinstance(error, FileNotFoundError) or (
        isinstance(error, OSError) and error.errno == errno.ENOENT
    ):
        return Problem(
            f"{path} does not exist",
            "Check the path. If a run is about to start there, leave this page open: it shows "
            "the run as soon as its folder holds one.",
        )
    if isinstance(error, ConfigurationError):  # the store's message says what a run is
        return Problem(
            str(error),
            "Give `arttrace view` a run folder. This page reads the folder again every few "
            "seconds, and shows the run once the folder holds one.",
        )
    return Problem(
        f"{path}: {type(error).__name__}: {error}",
        "This looks like a bug in arttrace's viewer: the server's log has the details; please "
        "report it with them.",
    )


class Tokenizers:
    """The folders' tokenizers, loaded on a thread of their own (loading transformers takes
    seconds: never on a folder's thread, which answers the pages); each source once."""

    def __init__(self, given: Decoder | None = None) -> None:
        self.given = given
        """``--tokenizer``'s, for every folder; ``None``: each folder's own, found."""
        self._loaded: dict[str, Decoder | TokenizerError] = {}
        self._thread: _Worker | None = None
        self._lock = threading.Lock()

    def load(self, found: Found) -> Future[Decoder]:
        with self._lock:
            if self._thread is None:
                self._thread = _Worker("arttrace view: tokenizers")
            return self._thread.submit(lambda: self._load(found))

    def _load(self, found: Found) -> Decoder:
        known = self._loaded.get(found.source)
        if known is None:
            try:
                known = load(found)
            except Exception as error:  # the header says so; the pages show ids
                if not isinstance(error, TokenizerError):
                    error = TokenizerError(
                        f"the tokenizer {found.name} ({found.source}) cannot be used: "
                        f"{type(error).__name__}: {error}"
                    )
                _log.warning("arttrace view: %s", error)
                known = error
            self._loaded[found.source] = known
        if isinstance(known, TokenizerError):
            raise known
        return known

    def stop(self) -> None:
        with self._lock:
            if self._thread is not None:
                self._thread.stop()


class RunSlot:
    """One folder given to ``arttrace view``: its store once open, or why it is not."""

    def __init__(
        self, index: int, path: Path, label: str, given: str, tokenizers: Tokenizers | None = None
    ) -> None:
        self.index, self.path, self.label = index, path, label
        self.given = given
        """The path as the command line gave it (what the pages show)."""
        self.state: State = "opening"
        self.problem: Problem | None = None
        self.kind: str | None = None
        self.version = 0
        """Grows each time what the folder holds changes (its pages then fetch again)."""
        self.opening_since = time.monotonic()
        self._store: RunStore | None = None
        self._stamp: tuple[object, ...] = ()
        self._retry_at = 0.0
        self._thread = _Worker(f"arttrace view: {label}")
        self._pending: Future[None] | None = None
        self._closed = False
        self._tokenizers = tokenizers or Tokenizers()
        self.decoder: Decoder | None = self._tokenizers.given
        """What gives its token ids their text (``None``: none, the pages show ids)."""
        self.found: Found | None = None if self.decoder is None else self.decoder.found
        self.tokenizer_state = "ready" if self.decoder is not None else "none"
        self.tokenizer_problem: str | None = None
        self._looked_at: float | None = None
        self._look_failed = False

    # -- the timer's side --------------------------------------------------------------------

    def tick(self) -> None:
        """Open or refresh the store on the folder's thread, unless that is already under
        way (a first index of a big run can take a while; ticks do not pile up behind it)."""
        if self._closed or (self._pending is not None and not self._pending.done()):
            return
        self._pending = self._thread.submit(self._tick)

    def _tick(self) -> None:
        try:
            if self._store is None:
                if time.monotonic() < self._retry_at:
                    return
                self._store = open_run(self.path)
                self.kind = self._store.kind
                self._stamp = self._files_stamp()
                self._changed("ready")
                self._look_for_tokenizer()
                return
            new = self._store.refresh()
            stamp = self._files_stamp()
            if new or stamp != self._stamp:
                self._stamp = stamp
                self.version += 1
                self._look_for_tokenizer()
        except Exception as error:  # the page says what is wrong; the viewer goes on
            self._fail(error)

    # -- the tokenizer ------------------------------------------------------------------------

    def tokenizer(self) -> dict[str, str | None]:
        """What the page says gives the tokens their text (``state``: ready, loading, failed,
        none)."""
        found = self.found
        return {
            "state": self.tokenizer_state,
            "name": None if found is None else found.name,
            "source": None if found is None else found.source,
            "origin": None if found is None else found.origin,
            "problem": self.tokenizer_problem,
        }

    def _look_for_tokenizer(self) -> None:
        """Find the folder's tokenizer (on the folder's thread: files and the Hugging Face
        cache's index only) and have it loaded; again, while the folder grows, until one is
        found."""
        store = self._store
        if store is None or self.tokenizer_state in ("ready", "loading"):
            return
        now = time.monotonic()
        if self._looked_at is not None and now - self._looked_at < LOOK_AGAIN_SECONDS:
            return
        self._looked_at = now
        try:
            found = discover(self.path, _models(store))
        except Exception:  # a tokenizer is a nicety: the pages show ids without one
            if not self._look_failed:
                self._look_failed = True
                _log.warning(
                    "arttrace view: looking for %s's tokenizer failed (the pages show token "
                    "ids; --tokenizer gives them their text)",
                    self.path,
                    exc_info=True,
                )
            return
        if found is None or (found == self.found and self.tokenizer_state == "failed"):
            return
        self.found, self.tokenizer_state, self.tokenizer_problem = found, "loading", None
        self.version += 1
        self._tokenizers.load(found).add_done_callback(
            lambda done: self._thread.submit(lambda: self._tokenizer_loaded(found, done))
        )

    def _tokenizer_loaded(self, found: Found, done: Future[Decoder]) -> None:
        if found != self.found:
            return
        try:
            self.decoder = done.result()
            self.tokenizer_state = "ready"
        except Exception as error:  # TokenizerError: logged once where it was loaded
            self.tokenizer_state, self.tokenizer_problem = "failed", str(error)
        self.version += 1

    def _fail(self, error: BaseException) -> None:
        problem = problem_of(self.path, error)
        if problem.fix.startswith("This looks like a bug"):
            _log.exception("arttrace view: reading %s failed", self.path)
        if self._store is not None:
            try:
                self._store.close()
            except Exception:
                _log.warning("arttrace view: closing the store of %s failed", self.path)
            self._store = None
        self._retry_at = time.monotonic() + RETRY_SECONDS
        if problem != self.problem or self.state != "failed":
            self.problem = problem
            self._changed("failed")

    def _changed(self, state: State) -> None:
        if state != "failed":
            self.problem = None
        self.state = state
        self.version += 1

    def _files_stamp(self) -> tuple[object, ...]:
        """What changes when a step's metrics, a validation or a step's shipping is written
        (the journal's lines are the store's to count)."""
        stamp: list[object] = []
        for name in ("metrics.jsonl", "validation.jsonl", "journal"):
            try:
                status = os.stat(self.path / name)
            except OSError:
                stamp.append(None)
                continue
            stamp.append((status.st_size, status.st_mtime_ns))
        journal = self.path / "journal"
        if journal.is_dir():
            try:
                last = max((e.name for e in os.scandir(journal) if e.is_dir()), default=None)
            except OSError:
                last = None
            if last is not None:
                status = os.stat(journal / last)
                stamp.append((last, status.st_mtime_ns))
        return tuple(stamp)

    # -- the pages' side ---------------------------------------------------------------------

    async def read[T](self, query: Callable[[RunStore], T]) -> T:
        """``query(store)`` on the folder's thread; :class:`NotReady` while there is no store."""
        if self._store is None or self._closed:
            raise NotReady(self)

        def run() -> T:
            store = self._store
            if store is None:
                raise NotReady(self)
            return query(store)

        return await asyncio.wrap_future(self._thread.submit(run))

    def close(self, timeout: float = 5.0) -> None:
        """Close the store once the folder's thread is free; a first index still under way
        after ``timeout`` is left to end with the process (the index stays consistent: SQLite
        rolls back what was not committed)."""
        self._closed = True

        def close_store() -> None:
            if self._store is not None:
                self._store.close()
                self._store = None

        done = self._thread.submit(close_store)
        self._thread.stop()
        try:
            done.result(timeout)
        except Exception:  # TimeoutError, or the store failing to close: the process ends
            _log.debug("arttrace view: %s not closed", self.path, exc_info=True)


class _Worker:
    """One daemon thread running what is submitted, in order: a first index of a big run
    never holds up the viewer's exit."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[[], object], Future[object]] | None] = (
            queue.SimpleQueue()
        )
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def submit[T](self, work: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        self._queue.put((work, future))  # type: ignore[arg-type]
        return future

    def stop(self) -> None:
        self._queue.put(None)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            work, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(work())
            except BaseException as error:
                future.set_exception(error)


class Runs:
    """The folders, and the timer that keeps them current."""

    def __init__(
        self,
        paths: list[Path],
        refresh_seconds: float = REFRESH_SECONDS,
        tokenizer: Decoder | None = None,
    ) -> None:
        self.tokenizers = Tokenizers(tokenizer)
        self.slots = [
            RunSlot(i, p, label, str(given), self.tokenizers)
            for i, ((p, label), given) in enumerate(zip(_labelled(paths), paths, strict=True))
        ]
        self.refresh_seconds = refresh_seconds
        self._stop = threading.Event()
        self._timer = threading.Thread(
            target=self._loop, name="arttrace view: refresh", daemon=True
        )

    def start(self) -> None:
        for slot in self.slots:
            slot.tick()
        self._timer.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.refresh_seconds):
            for slot in self.slots:
                slot.tick()

    def get(self, index: int) -> RunSlot | None:
        return self.slots[index] if 0 <= index < len(self.slots) else None

    def stop(self) -> None:
        self._stop.set()
        if self._timer.is_alive():
            self._timer.join(timeout=5)
        for slot in self.slots:
            slot.close()
        self.tokenizers.stop()


def _models(store: RunStore) -> list[str]:
    """The model names the folder's newest runs called, their policy's first (the name the
    server answered with before the one asked for)."""
    names: list[str] = []
    for row in store.trajectories(order="-id", limit=2):
        calls = sorted(store.trajectory(row.id).calls, key=lambda c: not c.trainable)
        for call in calls:
            for name in (call.response_model, call.model):
                if name and name not in names:
                    names.append(name)
    return names


def _labelled(paths: list[Path]) -> list[tuple[Path, str]]:
    """Each folder with a short name: its own, or with as many parents as tell it apart."""
    resolved = [p.expanduser().absolute() for p in paths]
    depth = 1
    while True:
        labels = ["/".join(p.parts[-depth:]) or str(p) for p in resolved]
        if len(set(labels)) == len(labels) or depth > max(len(p.parts) for p in resolved):
            return list(zip(resolved, labels, strict=True))
        depth += 1
