"""Gateway mode: train agents that run in another process or another language.

``arttrace.Gateway`` (and the ``arttrace gateway`` command) serve an OpenAI-compatible API in
front of the policy server, with one base URL per run; every call made to a run's URL is
recorded into that run's trajectory as a policy turn, with the server's exact tokens. Needs
the ``gateway`` extra (starlette and uvicorn serve; aiohttp calls the upstream):
``pip install 'arttrace[gateway]'``.

``Gateway`` loads on first use, so the command checks its arguments (``_options``) before
anything heavy is imported.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._gateway import Gateway

__all__ = ["Gateway"]


def __getattr__(name: str) -> Any:
    if name != "Gateway":
        raise AttributeError(f"module 'arttrace.gateway' has no attribute {name!r}")
    try:
        import aiohttp  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as error:  # pragma: no cover - depends on the installed extras
        raise ImportError(
            "arttrace.Gateway needs starlette, uvicorn and aiohttp: pip install 'arttrace[gateway]'"
        ) from error
    from ._gateway import Gateway

    return Gateway
