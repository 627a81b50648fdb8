"""``@trainable``: the LLM calls made inside are the policy's turns."""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncGenerator, Callable, Generator, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast, overload

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span

from . import _context
from ._context import TrainableScope
from ._guard import guarded
from ._redact import exception_attributes

F = TypeVar("F", bound=Callable[..., Any])
_tracer = trace.get_tracer("arttrace")


@overload
def trainable(fn: F, /) -> F: ...
@overload
def trainable(
    *, name: str | None = None, model: str | None = None, policy: str | None = None
) -> Callable[[F], F]: ...


def trainable(
    fn: F | None = None,
    /,
    *,
    name: str | None = None,
    model: str | None = None,
    policy: str | None = None,
) -> F | Callable[[F], F]:
    """Mark a function (sync, async, generator or async generator) whose LLM calls are trained.

    ``name`` labels its span and its calls (default: the function's qualified name); ``model``
    limits the policy to calls to that model (a judge called inside stays context). Nested
    ``@trainable`` functions are fine: a call is a policy turn if any enclosing one accepts it.
    ``policy`` names the policy its turns belong to (recorded as ``LLMCall.policy``; the
    innermost accepting function's counts), for roles that share one model name: without it,
    a turn belongs to the policy of the model it was sent to (``Trajectory.to_art(policy=...)``).
    """

    def decorate(fn: F) -> F:
        scope = TrainableScope(name or fn.__qualname__, model, policy)
        if inspect.isasyncgenfunction(fn):
            return cast(F, _wrap_async_generator(fn, scope))
        if inspect.isgeneratorfunction(fn):
            return cast(F, _wrap_generator(fn, scope))
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with _span(scope) as span, _active(scope, span):
                    return await fn(*args, **kwargs)

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with _span(scope) as span, _active(scope, span):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate(fn) if fn is not None else decorate


@contextmanager
def _span(scope: TrainableScope) -> Iterator[Span]:
    attributes: dict[str, str] = {"arttrace.agent": scope.name}
    if scope.model:
        attributes["arttrace.policy_model"] = scope.model
    if scope.policy:
        attributes["arttrace.policy"] = scope.policy
    span = _tracer.start_span(f"trainable {scope.name}", attributes=attributes)
    try:
        yield span
    except BaseException as error:
        with guarded("recording a @trainable function's exception"):
            span.record_exception(error, attributes=exception_attributes(error))
        raise
    finally:
        span.end()


@contextmanager
def _active(scope: TrainableScope, span: Span) -> Iterator[None]:
    """The scope (and its span) current for the code run inside, and only for it."""
    run = _context.current_trajectory_var.get()
    if run is not None:
        run.call_log.policy_ran = True
    token = _context.trainable_scopes.set((*_context.trainable_scopes.get(), scope))
    otel_token = otel_context.attach(trace.set_span_in_context(span))
    try:
        yield
    finally:
        otel_context.detach(otel_token)
        _context.trainable_scopes.reset(token)


def _wrap_generator(fn: Callable[..., Generator[Any, Any, Any]], scope: TrainableScope) -> Any:
    # The scope is active while the generator's own code runs, never between its yields.
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
        with _span(scope) as span:
            with _active(scope, span):
                gen = fn(*args, **kwargs)
            sent: Any = None
            thrown: BaseException | None = None
            while True:
                with _active(scope, span):
                    try:
                        item = gen.throw(thrown) if thrown is not None else gen.send(sent)
                    except StopIteration as stop:
                        return stop.value
                sent, thrown = None, None
                try:
                    sent = yield item
                except GeneratorExit:
                    with _active(scope, span):
                        gen.close()
                    raise
                except BaseException as error:
                    thrown = error

    return wrapper


def _wrap_async_generator(
    fn: Callable[..., AsyncGenerator[Any, Any]], scope: TrainableScope
) -> Any:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, Any]:
        with _span(scope) as span:
            with _active(scope, span):
                gen = fn(*args, **kwargs)
            sent: Any = None
            thrown: BaseException | None = None
            while True:
                with _active(scope, span):
                    try:
                        item = await (gen.athrow(thrown) if thrown is not None else gen.asend(sent))
                    except StopAsyncIteration:
                        return
                sent, thrown = None, None
                try:
                    sent = yield item
                except GeneratorExit:
                    with _active(scope, span):
                        await gen.aclose()
                    raise
                except BaseException as error:
                    thrown = error

    return wrapper
