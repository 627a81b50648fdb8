"""Test instrumented agents offline: a scripted OpenAI/vLLM-compatible model, served on
127.0.0.1 (:func:`serve`) or in-process (:meth:`ScriptedLLM.transport`, or
:meth:`ScriptedLLM.handle` as a respx side effect)."""

from .llm import Reply, ScriptedLLM, ScriptExhausted, ToolCall, echo
from .server import LLMServer, serve
from .tokenizers import ChatTokenizer, Completion, HFChatTokenizer, SimpleChatTokenizer

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
