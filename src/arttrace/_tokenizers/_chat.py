"""Chat tokenizers for the scripted server: the built-in one, or a Hugging Face one for exact
ids (ART's tokenizer checks that each turn's prompt extends the previous prompt and turn)."""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

_PIECES = re.compile(r"\w+|\s+|[^\w\s]")
type Messages = list[dict[str, Any]]
"""A conversation as an OpenAI client sends it: its messages."""
type Tools = list[dict[str, Any]] | None
"""The tools the request offers, in the OpenAI format (``None``: none)."""


@dataclass(frozen=True, slots=True)
class Completion:
    """The sampled token ids of one reply, and how they split: content, each tool call, end."""

    token_ids: list[int]
    content_tokens: int
    tool_call_tokens: list[int]


class ChatTokenizer(Protocol):
    def prompt(self, messages: Messages, tools: Tools) -> list[int]:
        """Token ids of the rendered conversation, ending with the assistant generation prompt."""
        ...

    def completion(self, messages: Messages, tools: Tools, reply: dict[str, Any]) -> Completion:
        """Token ids the model samples for ``reply`` (an assistant message), end token included."""
        ...

    def text(self, token_id: int) -> str:
        """The text of one token."""
        ...


class SimpleChatTokenizer:
    """ChatML rendering with a word/space/punctuation tokenizer; ids are stable hashes.

    Every message part is tokenized on its own, so a conversation's ids always extend the ids of
    its earlier prompt plus the sampled turn, as with a real chat template.
    """

    SPECIAL: ClassVar[dict[str, int]] = {
        "<|endoftext|>": 0,
        "<|im_start|>": 1,
        "<|im_end|>": 2,
        "<tool_call>": 3,
        "</tool_call>": 4,
    }

    def __init__(self) -> None:
        self._texts: dict[int, str] = {v: k for k, v in self.SPECIAL.items()}

    def encode(self, text: str) -> list[int]:
        ids = []
        for piece in _PIECES.findall(text):
            token_id = 16 + zlib.crc32(piece.encode()) % 150_000
            self._texts.setdefault(token_id, piece)
            ids.append(token_id)
        return ids

    def text(self, token_id: int) -> str:
        return self._texts.get(token_id, "")

    def prompt(self, messages: Messages, tools: Tools) -> list[int]:
        ids: list[int] = []
        if tools:
            ids += (
                self._header("system")
                + self.encode(json.dumps(tools, sort_keys=True))
                + self._end()
            )
        for message in messages:
            ids += self._header(str(message.get("role"))) + self._body(message) + self._end()
        return ids + self._header("assistant")

    def completion(self, messages: Messages, tools: Tools, reply: dict[str, Any]) -> Completion:
        content = self.encode(_content_text(reply.get("content")))
        calls = [self._tool_call(tc) for tc in reply.get("tool_calls") or ()]
        ids = content + [i for call in calls for i in call] + [self.SPECIAL["<|im_end|>"]]
        return Completion(ids, len(content), [len(call) for call in calls])

    def _header(self, role: str) -> list[int]:
        return [self.SPECIAL["<|im_start|>"], *self.encode(role + "\n")]

    def _end(self) -> list[int]:
        return [self.SPECIAL["<|im_end|>"], *self.encode("\n")]

    def _body(self, message: dict[str, Any]) -> list[int]:
        ids = self.encode(_content_text(message.get("content")))
        for tc in message.get("tool_calls") or ():
            ids += self._tool_call(tc)
        return ids

    def _tool_call(self, tool_call: dict[str, Any]) -> list[int]:
        function = tool_call["function"]
        arguments = function.get("arguments") or "{}"
        if isinstance(arguments, str):
            arguments = json.loads(arguments)
        body = json.dumps({"name": function["name"], "arguments": arguments})
        return [self.SPECIAL["<tool_call>"], *self.encode(body), self.SPECIAL["</tool_call>"]]


class HFChatTokenizer:
    """A Hugging Face tokenizer with a chat template: the ids vLLM would use for that model."""

    def __init__(self, tokenizer: Any, end_token: str = "<|im_end|>") -> None:
        self.tokenizer = tokenizer
        self.end_id = int(tokenizer.convert_tokens_to_ids(end_token))

    def _render(self, messages: Messages, tools: Tools, generation_prompt: bool) -> list[int]:
        out = self.tokenizer.apply_chat_template(
            [_template_message(m) for m in messages],
            tools=tools or None,
            add_generation_prompt=generation_prompt,
            tokenize=True,
        )
        ids = out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out
        return [int(i) for i in ids]

    def prompt(self, messages: Messages, tools: Tools) -> list[int]:
        return self._render(messages, tools, True)

    def completion(self, messages: Messages, tools: Tools, reply: dict[str, Any]) -> Completion:
        prompt = self.prompt(messages, tools)
        full = self._render([*messages, reply], tools, False)
        if full[: len(prompt)] != prompt:
            raise ValueError(
                "the chat template does not render a turn as an extension of its prompt"
            )
        ids = full[len(prompt) :]
        ids = ids[: ids.index(self.end_id) + 1] if self.end_id in ids else [*ids, self.end_id]
        content = _content_text(reply.get("content"))
        calls = len(reply.get("tool_calls") or ())
        content_tokens = 0 if calls else len(ids) - 1
        if content and calls:
            decode = self.tokenizer.decode
            # The longest prefix that is still text: a token merging the text's end with what
            # follows (Qwen's ".\n") belongs to the tool call.
            content_tokens = max(
                (k for k in range(len(ids)) if content.startswith(decode(ids[:k]))), default=0
            )
        rest = len(ids) - 1 - content_tokens
        split = (
            [rest // calls + (1 if i < rest % calls else 0) for i in range(calls)] if calls else []
        )
        return Completion(ids, content_tokens, split)

    def text(self, token_id: int) -> str:
        return str(self.tokenizer.decode([token_id]))


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict))


def _template_message(message: dict[str, Any]) -> dict[str, Any]:
    out = dict(message)
    out["content"] = _content_text(message.get("content"))
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {
                **tc,
                "function": {
                    "name": tc["function"]["name"],
                    "arguments": json.loads(tc["function"]["arguments"] or "{}")
                    if isinstance(tc["function"].get("arguments"), str)
                    else tc["function"].get("arguments"),
                },
            }
            for tc in message["tool_calls"]
        ]
    return out
