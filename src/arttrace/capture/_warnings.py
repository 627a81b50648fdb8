"""One warning per run, model and cause when a policy turn cannot be trained."""

from __future__ import annotations

import logging
import os
import sys
import sysconfig
import threading
import warnings
from typing import Protocol

from ._records import NO_LOGPROBS_INCLUDE_REASONING, TOKENS_MISSING, UNREADABLE

_log = logging.getLogger("arttrace")
_ARTTRACE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LAYERS = (
    "openai",
    "wrapt",
    "agents",
    "litellm",
    "dspy",
    "httpx",
    "httpcore",
    "aiohttp",
    "requests",
    "urllib3",
    "http",
    "urllib",
)
"""Packages between the caller and the capture layers (SDKs, frameworks that send through an
HTTP client, the clients themselves), skipped so the warning points at the caller."""

_FIXES = {
    "no logprobs": (
        "Ask for them with logprobs=True (arttrace adds it to @trainable calls unless "
        "request_training_data=False) and serve the model with vLLM >= 0.10.2 (or ART's own "
        "server), which returns them with the token ids."
    ),
    NO_LOGPROBS_INCLUDE_REASONING: (
        "The request set include_reasoning=false: vLLM with a tool or reasoning parser then "
        "drops the logprobs and token ids too. Leave include_reasoning unset on @trainable "
        "calls (hide the reasoning from users after the call instead)."
    ),
    TOKENS_MISSING: (
        "The server's usage counts more completion tokens than the stream carried token ids "
        "for: vLLM 0.10.2 to 0.12.x drop the chunks a tool or reasoning parser holds back "
        "(vllm-project/vllm#27482), ids and logprobs together, so the turn is not what was "
        "sampled. Upgrade to vLLM >= 0.13, or call without stream=True."
    ),
    "no token ids": (
        "ART needs the exact token ids: serve the model with vLLM and pass "
        "extra_body={'return_token_ids': True} (arttrace adds it to @trainable calls unless "
        "request_training_data=False)."
    ),
    "token ids and logprobs differ in length": (
        "The server's token ids and logprobs disagree; check the vLLM version and that no "
        "proxy rewrites the response."
    ),
    UNREADABLE: (
        "The server's response had a shape arttrace could not read (the error is logged); "
        "the caller got it unchanged. Check the server or proxy; please report it if the "
        "response was valid."
    ),
    "the response was incomplete": "The stream was cut or abandoned; the partial call is marked.",
    "no finish reason": "The server sent no finish_reason; the turn cannot become an ART Choice.",
    "generation aborted": (
        "The server ended the turn before it was complete (vLLM's finish_reason 'abort': a "
        "paused or cancelled engine, or another reason outside the OpenAI set); a partial "
        "sample is not trained on. Let the generation finish (do not pause the engine with "
        "mode=abort while rollouts run)."
    ),
}


class UntrainableTurnWarning(UserWarning):
    """A policy turn was captured but lacks what ART needs to train on it."""


_seen: set[tuple[str, str]] = set()
_lock = threading.Lock()


def warn_unrecorded(what: str, example_id: str) -> None:
    """Warn once per ``what`` that the gateway forwarded a call it does not record."""
    _warn_once(
        ("gateway", what),
        f"arttrace gateway: run {example_id!r} called {what}, which the gateway forwards but "
        "does not record, so its turns will not train; later calls are not reported again. "
        "Have the agent use the run's Chat Completions or Responses API (an OpenAI client "
        "with base_url=gateway.url(t)).",
        UntrainableTurnWarning,
    )


class Run(Protocol):
    """What a run keeps of its warnings (``CallLog``): its name, the (model, cause) pairs told."""

    name: str
    warned: set[tuple[str, str]]


def warn_untrainable(
    model: str, reason: str, fix: str | None = None, *, run: Run | None = None
) -> None:
    """Warn once per ``run``, model and reason (every run that loses a turn says so, not only
    the first of the process); once per process for a call outside any run. ``fix`` replaces
    the generic advice for ``reason``."""
    text = (
        f"a @trainable call to model {model!r} cannot be trained ({reason}); its turn is kept "
        f"as context only. {fix or _FIXES.get(reason, '')}"
    )
    if run is None:
        _warn_once((model, reason), f"arttrace: {text}", UntrainableTurnWarning)
        return
    with _lock:
        if (model, reason) in run.warned:
            return
        run.warned.add((model, reason))
    warn_every_time(f"arttrace: run {run.name!r}: {text}", UntrainableTurnWarning)


class NothingToTrainWarning(UserWarning):
    """A run's ``@trainable`` code ran (or it has a gateway URL) but no policy turn was
    recorded: the run would reach the Trainer with its reward and nothing to train on. The
    Trainer gives it too, once per step, when groups it would ship hold no trainable token."""


_NOTHING_TO_TRAIN = {
    "arttrace.instrument() was not called": (
        "Call arttrace.instrument() once at start-up, or wrap the agent's client with "
        "arttrace.wrap_openai(client)."
    ),
    "its LLM calls ran outside every @trainable function": (
        "Decorate the agent function that calls the model with @arttrace.trainable (calls in "
        "tasks and threads it starts count too); with @trainable(model=...), the name must be "
        "the request's model."
    ),
    "DSPy's cache answered": (
        "A cached answer has no tokens to train on, and every repeat of a prompt is answered "
        "from the cache: turn it off for rollouts, dspy.LM(..., cache=False)."
    ),
    "no call reached its gateway URL": (
        "Give the agent the run's URL as its OpenAI base URL (gateway.url(t), or the url POST "
        "/runs answered) and check that it calls it."
    ),
    "its gateway calls recorded no policy turn": (
        "The gateway trains on Chat Completions and Responses calls to the run's model (the "
        "model option, if set, must be the request's model); legacy Completions calls "
        "(/v1/completions) are kept as context only, and Anthropic Messages calls "
        "(/v1/messages) and other routes (/v1/models) are forwarded unrecorded unless the "
        "run translates them (--translate messages; docs/translation.md)."
    ),
    "no LLM call was seen": (
        "The agent may call the model from another process (point it at an arttrace.Gateway "
        "run URL), over a transport arttrace does not hook (the OpenAI Agents SDK's Responses "
        "websocket; an HTTP client other than httpx, aiohttp, requests or the standard "
        "library's), or a cache answered (DSPy's or a framework's: turn caches off for "
        "rollouts)."
    ),
}


def warn_nothing_to_train(example_id: str, cause: str, *, gateway: bool = False) -> None:
    """Warn once per ``cause`` (a key of the table above) that a run will train on nothing."""
    ran = "has a gateway URL" if gateway else "ran @trainable code"
    _warn_once(
        ("", cause),
        f"arttrace: run {example_id!r} {ran} but recorded no policy turn "
        f"({cause}), so it would train on nothing; later runs with this cause are not "
        f"reported again. {_NOTHING_TO_TRAIN[cause]}",
        NothingToTrainWarning,
    )


class TokenContinuityWarning(UserWarning):
    """Too many of a step's turns have prompt token ids that do not extend the previous turn's
    prompt and sampled ids, so ART trains those runs as several sequences each. Given once per
    step by the Trainer, with the most common cause and its fix (``docs/continuity.md``)."""


class RunOutlivedWarning(UserWarning):
    """Work a run handed to another thread called the model after the run ended: the call
    belongs to no run. Its cause says whether the thread outlived the run or serves other runs
    (a shared worker started inside one run)."""


_RUN_OUTLIVED = {
    "thread": (
        "a thread started inside run {run!r} called the model after the run ended, so the call "
        "belongs to no run; later calls with this cause are not reported again. Join the "
        "thread inside the run's `with` block; a worker that outlives runs is started outside "
        "them, and each piece of work is handed over with arttrace.carry(fn)."
    ),
    "task": (
        "work submitted inside run {run!r} (ThreadPoolExecutor.submit, loop.run_in_executor, "
        "arttrace.carry) ran after the run ended, so its call belongs to no run; later calls "
        "with this cause are not reported again. Wait for its result inside the run's `with` "
        "block."
    ),
    "shared worker": (
        "a thread started inside run {run!r} is still calling the model after that run ended, "
        "while other runs are open: it looks like a shared worker (a queue consumer) serving "
        "other runs' work. Its calls belong to no run now, and while {run!r} was open they "
        "were recorded into {run!r}, whichever run the work came from; later calls with this "
        "cause are not reported again. Start shared workers outside every run and hand each "
        "piece of work over with arttrace.carry(fn) (it records into the run that made it), or "
        "open the run inside the worker."
    ),
}


def warn_run_outlived(example_id: str, cause: str) -> None:
    """Warn once per ``cause`` (``"thread"``, ``"task"`` or ``"shared worker"``) that work
    carried into another thread called after its run ended."""
    _warn_once(
        ("run outlived", cause),
        "arttrace: " + _RUN_OUTLIVED[cause].format(run=example_id),
        RunOutlivedWarning,
    )


def fix_for(cause: str) -> str:
    """The advice for ``cause``: an untrainable reason or a nothing-to-train cause."""
    return _FIXES.get(cause) or _NOTHING_TO_TRAIN.get(cause, "")


def warn_every_time(message: str, category: type[Warning]) -> None:
    """Warn at the caller's line, each time (the Trainer's per-step warnings); logged instead
    when a warning filter would make it an exception."""
    try:
        warnings.warn(message, category, skip_file_prefixes=_internal())
    except Exception:
        _log.warning("%s (logged: the warning filter turned the warning into an error)", message)


def _warn_once(key: tuple[str, str], message: str, category: type[Warning]) -> None:
    """Warn once per ``key``, at the caller's line. A warning filter that turns the warning
    into an error (``-W error``) must not make it the caller's exception: the text is logged
    instead."""
    with _lock:
        if key in _seen:
            return
        _seen.add(key)
    warn_every_time(message, category)


def _internal() -> tuple[str, ...]:
    """arttrace's folder and the installed packages of ``_LAYERS`` (an application's own module
    named ``agents`` or ``http`` is the caller, not a layer)."""
    installed = tuple({sysconfig.get_path(k) for k in ("purelib", "platlib", "stdlib")})
    loaded = (sys.modules.get(name) for name in _LAYERS)
    folders = (
        os.path.dirname(m.__file__)
        for m in loaded
        if m is not None and m.__file__ and hasattr(m, "__path__")
    )
    return (_ARTTRACE, *(f + os.sep for f in folders if f.startswith(installed)))


def reset() -> None:
    """Forget which warnings were given (tests, long-lived notebooks)."""
    with _lock:
        _seen.clear()
