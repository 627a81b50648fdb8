"""What a framework has in flight (LLM calls, agent and tool steps, runs), keyed by the
framework's own id for each: its callbacks arrive on any thread, for many runs at once."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable


class InFlight[K: Hashable, V]:
    """Values by key, behind one lock. A key holds a stack, for a key entered again before it
    ends (a nested call under the same key, an agent run inside itself): :meth:`top` and
    :meth:`pop` see the innermost.

    A key made from ``id(obj)`` stays unique while its value holds ``obj``."""

    __slots__ = ("_items", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[K, list[V]] = {}

    def push(self, key: K, value: V) -> None:
        with self._lock:
            self._items.setdefault(key, []).append(value)

    def claim(self, key: K, value: V) -> bool:
        """Add ``value`` unless ``key`` is in flight already (another handler has it)."""
        with self._lock:
            if key in self._items:
                return False
            self._items[key] = [value]
            return True

    def top(self, key: K) -> V | None:
        with self._lock:
            stack = self._items.get(key)
            return stack[-1] if stack else None

    def pop(self, key: K) -> V | None:
        """Remove and return the innermost value of ``key``, if any."""
        with self._lock:
            stack = self._items.get(key)
            if not stack:
                return None
            value = stack.pop()
            if not stack:
                del self._items[key]
            return value

    def remove(self, where: Callable[[V], bool] = lambda _: True) -> list[V]:
        """Remove and return the values ``where`` accepts (all by default), innermost first
        within a key."""
        removed: list[V] = []
        with self._lock:
            for key, stack in list(self._items.items()):
                hits = [where(v) for v in stack]
                keep = [v for v, hit in zip(stack, hits, strict=True) if not hit]
                removed.extend(v for v, hit in zip(stack[::-1], hits[::-1], strict=True) if hit)
                if keep:
                    self._items[key] = keep
                else:
                    del self._items[key]
        return removed

    def __len__(self) -> int:
        with self._lock:
            return sum(len(stack) for stack in self._items.values())
