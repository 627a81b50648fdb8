"""Translation: an agent speaking the Responses API or Anthropic Messages, served through the
upstream's Chat Completions so every turn trains with exact tokens (opt-in; see
``docs/translation.md``). ``arttrace.instrument(translate=...)`` and the gateway's
``--translate`` open one translation per call (``_registry``); ``MessagesTranslation`` loads
on first use."""

from typing import TYPE_CHECKING

from .._lazy import lazy
from ._base import Translation, TranslationError
from ._responses import Chains, ResponsesTranslation

if TYPE_CHECKING:
    from ._messages import MessagesTranslation

__all__ = [
    "Chains",
    "MessagesTranslation",
    "ResponsesTranslation",
    "Translation",
    "TranslationError",
]

__getattr__, __dir__ = lazy(__name__, {"MessagesTranslation": "._messages"})
