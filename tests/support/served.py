"""What the scripted server sent, to check a record's tokens against: the bytes a caller read,
or the answers kept by :class:`KeptLLM` when a framework reads them for the caller."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from arttrace.testing import ScriptedLLM


def served(data: bytes, streamed: bool) -> tuple[list[int], list[int], list[float]]:
    """The prompt ids, sampled ids and logprobs of the one choice the server sent in ``data``."""
    if not streamed:
        answer = json.loads(data)
        (choice,) = answer["choices"]
        logprobs = [t["logprob"] for t in choice["logprobs"]["content"]]
        return answer["prompt_token_ids"], choice["token_ids"], logprobs
    events = [json.loads(line[6:]) for line in data.splitlines() if line.startswith(b"data: {")]
    prompt = next(e["prompt_token_ids"] for e in events if e.get("prompt_token_ids"))
    choices = [c for e in events for c in e["choices"]]
    ids = [i for c in choices for i in c.get("token_ids") or ()]
    logprobs = [
        t["logprob"] for c in choices if c.get("logprobs") for t in c["logprobs"]["content"]
    ]
    return prompt, ids, logprobs


class KeptLLM(ScriptedLLM):
    """The scripted model, keeping each Chat Completions answer's bytes as it sent them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.answers: list[tuple[bytes, bool]] = []

    def respond(
        self, body: dict[str, Any]
    ) -> tuple[int, dict[str, Any] | None, Iterator[bytes] | None]:
        status, payload, chunks = super().respond(body)
        if chunks is None:
            self.answers.append((json.dumps(payload).encode(), False))
            return status, payload, chunks
        kept = bytearray()
        self.answers.append((b"", True))
        index = len(self.answers) - 1

        def tee(chunks: Iterator[bytes]) -> Iterator[bytes]:
            for chunk in chunks:
                kept.extend(chunk)
                self.answers[index] = (bytes(kept), True)
                yield chunk

        return status, payload, tee(chunks)

    def tokens(self, index: int = -1) -> tuple[list[int], list[int], list[float]]:
        """The prompt ids, sampled ids and logprobs of answer ``index``."""
        return served(*self.answers[index])
