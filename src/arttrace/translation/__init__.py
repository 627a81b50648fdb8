"""Translation: an agent speaking the Responses API or Anthropic Messages, served through the
upstream's Chat Completions so every turn trains with exact tokens (opt-in; see
``docs/translation.md``)."""

from ._base import Translation, TranslationError
from ._registry import APIS, apis, open_translation, refusal, upstream_message
from ._responses import Chains, ResponsesTranslation

__all__ = [
    "APIS",
    "Chains",
    "ResponsesTranslation",
    "Translation",
    "TranslationError",
    "apis",
    "open_translation",
    "refusal",
    "upstream_message",
]
