"""The offline Qwen2.5-Instruct tokenizer; it lives in the package (the CPU backend uses it)."""

from arttrace.training._qwen_tokenizer import CHAT_TEMPLATE, KNOWN_IDS, qwen_tokenizer

__all__ = ["CHAT_TEMPLATE", "KNOWN_IDS", "qwen_tokenizer"]
