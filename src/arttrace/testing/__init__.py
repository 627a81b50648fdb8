"""Test instrumented agents offline: a scripted OpenAI/vLLM-compatible model, served on
127.0.0.1 (:func:`serve`) or in-process (:meth:`ScriptedLLM.transport`, or
:meth:`ScriptedLLM.handle` as a respx side effect)."""

from .._tokenizers._chat import ChatTokenizer, Completion, HFChatTokenizer, SimpleChatTokenizer
from ._llm import Reply, ScriptedLLM, ScriptExhausted, ToolCall, echo
from ._server import LLMServer, serve

__all__ = [
    "ChatTokenizer",
    "Completion",
    "HFChatTokenizer",
    "LLMServer",
    "Reply",
    "ScriptExhausted",
    "ScriptedLLM",
    "SimpleChatTokenizer",
    "ToolCall",
    "echo",
    "serve",
]
