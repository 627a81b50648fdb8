"""Gateway mode: train agents that run in another process or another language.

``arttrace.Gateway`` (and the ``arttrace gateway`` command) serve an OpenAI-compatible API in
front of the policy server, with one base URL per run; every call made to a run's URL is
recorded into that run's trajectory as a policy turn, with the server's exact tokens. Needs
the ``gateway`` extra (starlette and uvicorn serve; aiohttp calls the upstream):
``pip install 'arttrace[gateway]'``.

``Gateway`` loads on first use, so the command checks its arguments (``_options``) before
anything heavy is imported.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy

if TYPE_CHECKING:
    from ._gateway import Gateway

__all__ = ["Gateway"]

__getattr__, __dir__ = lazy(__name__, {"Gateway": "._gateway"})
