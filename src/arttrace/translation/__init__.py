"""Translation: an agent speaking the Responses API or Anthropic Messages, served through the
upstream's Chat Completions so every turn trains with exact tokens (opt-in; see
``docs/translation.md``)."""

from ._base import Translation, TranslationError

__all__ = ["Translation", "TranslationError"]
