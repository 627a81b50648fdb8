"""Server-sent events reassembled from a byte stream on the side, whatever the bytes' framing."""

from __future__ import annotations


class EventReader:
    """Feed it the bytes of an ``text/event-stream`` body as they arrive; it returns the data of
    each event completed so far (``data:`` lines joined by newlines, per the SSE standard)."""

    __slots__ = ("_data", "_tail")

    def __init__(self) -> None:
        self._tail = b""
        self._data: list[bytes] = []

    @property
    def pending(self) -> bytes:
        """What has come of the event still unfinished (empty between whole events)."""
        return b"\n".join(self._data) + self._tail if self._data or self._tail else b""

    def feed(self, piece: bytes) -> list[bytes]:
        if (  # the usual piece, one whole ``data:`` event (vLLM sends one per chunk): at once
            not self._tail
            and not self._data
            and piece.startswith(b"data: ")
            and piece.find(b"\n") == len(piece) - 2
            and piece.endswith(b"\n\n")
        ):
            return [piece[6:-2]]
        lines = (self._tail + piece).split(b"\n")
        self._tail = lines.pop()  # an unfinished line waits for the next piece
        events: list[bytes] = []
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:  # a blank line ends the event
                if self._data:
                    events.append(b"\n".join(self._data))
                    self._data = []
            elif line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
        return events
