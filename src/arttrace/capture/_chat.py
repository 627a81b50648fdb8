"""Chat Completions through the OpenAI SDK: a :class:`Capture` is one call, read from the
request's keyword arguments and finished from the parsed response or from the stream's chunks."""

from __future__ import annotations

import operator
import types
from array import array
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import openai
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat.chat_completion import Choice

from . import _context
from ._calls import OpenCall, Settings
from ._guard import guarded
from ._records import (
    ChoiceRecord,
    LLMCall,
    compact_ids,
    compact_logprobs,
    field_of,
    jsonable,
    token_ids_from_tokens,
)
from ._redact import remember_client

if TYPE_CHECKING:
    from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob

_NOT_PARAMS = frozenset({"messages", "tools", "extra_headers", "extra_query", "timeout", "model"})
_SENTINELS = (openai.NotGiven, openai.Omit)
_RAW_RESPONSE_HEADER = "X-Stainless-Raw-Response"  # openai._constants: with_raw_response
_REASONING_KEYS = ("reasoning", "reasoning_content")
"""Where vLLM puts a reasoning parser's text: ``reasoning`` (0.11 on; the only one from 0.15),
``reasoning_content`` (0.10, and a copy until 0.14). Recorded as ``reasoning``, the form ART's
own histories normalise to (``art.trajectories._history.normalize_chat_message``)."""


def message_dict(message: Any) -> dict[str, Any]:
    """A request message as a plain dict (SDK message objects are dumped, dicts copied)."""
    if type(message) is dict or isinstance(message, Mapping):
        return dict(message)
    dump = getattr(message, "model_dump", None)
    if dump is not None:
        return dict(dump(exclude_none=True))
    raise TypeError(f"arttrace cannot record a message of type {type(message).__name__}")


def _given(value: Any) -> bool:
    return value is not None and not isinstance(value, _SENTINELS)


def with_training_fields(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` asking for logprobs and vLLM token ids, unless the caller already decided."""
    out = dict(kwargs)
    if not _given(out.get("logprobs")):
        out["logprobs"] = True
    extra_body = out.get("extra_body")
    extra = dict(extra_body) if isinstance(extra_body, Mapping) else {}
    if "return_token_ids" not in extra:
        extra["return_token_ids"] = True
        out["extra_body"] = extra
    return out


def with_usage_count(kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """``kwargs`` asking a stream for its final usage chunk (``stream_options.include_usage``),
    or ``None`` when the caller set ``stream_options`` itself (adding ``include_usage`` there
    would also turn on vLLM's ``continuous_usage_stats``) or reads the raw response (whose
    bytes would show the extra chunk)."""
    if _given(kwargs.get("stream_options")):
        return None
    headers = kwargs.get("extra_headers")
    if isinstance(headers, Mapping) and _RAW_RESPONSE_HEADER in headers:
        return None
    return {**kwargs, "stream_options": {"include_usage": True}}


class Capture(OpenCall):
    """One Chat Completions call through the OpenAI SDK.

    The response is read strictly: a shape the SDK lets through but a training record cannot
    hold (``message: null``, a token id beyond 64 bits, a null logprob, ...) raises
    :class:`Unreadable`, and the caller's entry points (:mod:`._openai`) turn any failure here
    into :meth:`lost`: the call is kept as context, marked, and the caller sees nothing.

    A policy stream also asks for the server's usage chunk, to check that every sampled token
    arrived (see ``LLMCall._tokens_missing``), when its caller can hide that chunk
    (``hide_usage``: the stream proxy drops the chunks :meth:`conceal` names).
    """

    __slots__ = ("_choices", "_provisional_usage", "kwargs", "usage_added")

    def __init__(
        self,
        kwargs: dict[str, Any],
        settings: Settings,
        server: Any,
        *,
        hide_usage: bool = False,
    ) -> None:
        trajectory = _context.current_trajectory_var.get()
        model = str(kwargs.get("model", ""))
        scope = _context.policy_scope(model) if trajectory is not None else None
        self.usage_added = False
        """arttrace asked for the usage chunk: the caller did not, and must not see it."""
        if scope is not None and settings.request_training_data:
            kwargs = with_training_fields(kwargs)
            if hide_usage and kwargs.get("stream") is True:
                counted = with_usage_count(kwargs)
                if counted is not None:
                    kwargs, self.usage_added = counted, True
        for name in ("messages", "tools"):  # an iterator would be used up by the record
            value = kwargs.get(name)
            if value is not None and _given(value) and not isinstance(value, list | tuple):
                kwargs = {**kwargs, name: list(value)}
        self.kwargs = kwargs
        remember_client(server, [kwargs.get("extra_headers"), kwargs.get("extra_query")])
        tools = kwargs.get("tools") if _given(kwargs.get("tools")) else None
        call = LLMCall(
            model=model,
            messages=[message_dict(m) for m in kwargs.get("messages") or ()],
            tools=[dict(t) for t in tools] if tools is not None else None,
            params={
                k: jsonable(v) for k, v in kwargs.items() if k not in _NOT_PARAMS and _given(v)
            },
            trainable=scope is not None,
            agent=scope.name if scope else None,
            policy=scope.policy if scope else None,
            streamed=bool(kwargs.get("stream")),
        )
        self._choices: dict[int, _StreamedChoice] = {}
        self._provisional_usage: dict[str, Any] | None = None
        super().__init__(call, trajectory, settings.export_tokens, server)

    # -- whole responses -------------------------------------------------------------------

    def complete(self, completion: ChatCompletion | dict[str, Any]) -> None:
        """The whole response: the SDK's ``ChatCompletion``, or its parsed JSON (a layer that
        sees bytes: the HTTP layer, the gateway). Nothing is validated as a whole: each field
        the record keeps is checked as it is read, as strictly from JSON as from the SDK's
        objects."""
        if not self._claim():
            return  # ended already (abandoned when its trajectory ended): the record stays
        with guarded("reading a Chat Completions response", self._mark_unreadable):
            _read_completion(self.call, completion)
        self._close()

    # -- streams ---------------------------------------------------------------------------

    # The stream's readers stay twins, one for the SDK's chunks, one for parsed JSON (the
    # whole response has one reader of both, :func:`_fields`): per chunk, reading the SDK's
    # objects as dicts cost a 256-chunk stream ~0.7 ms more CPU (x1.8 on reading it), about
    # half again arttrace's whole overhead on a streamed SDK call (bench_capture: ~1.2 ms).

    def add_event(self, event: Any) -> None:
        """:meth:`add_chunk` from a stream event's parsed JSON (the HTTP layer, the gateway)."""
        if self._done:
            return
        if type(event) is not dict:
            raise Unreadable(f"a stream event is {type(event).__name__}, not an object")
        call = self.call
        if call.response_id is None:
            call.response_id, call.response_model = (
                _name(event.get("id")),
                _name(event.get("model")),
            )
        if call.prompt_token_ids is None and "prompt_token_ids" in event:
            call.prompt_token_ids = _ids(event["prompt_token_ids"], "prompt_token_ids")
        choices = event.get("choices")
        if type(choices) is not list:
            choices = _list(choices, "choices")  # raises
        usage = event.get("usage")
        if usage is not None:
            self._add_usage(usage, final=not choices)
        for choice in choices:
            if type(choice) is not dict:
                raise Unreadable(f"a choice is {type(choice).__name__}, not an object")
            acc = self._choices.get(choice.get("index"))  # type: ignore[arg-type]
            if acc is None:  # a new choice: its index is checked once
                index = _index(choice)
                acc = self._choices[index] = _StreamedChoice(index)
            acc.add_data(choice)

    def add_chunk(self, chunk: ChatCompletionChunk) -> None:
        if self._done:
            return
        call = self.call
        if call.response_id is None:
            call.response_id, call.response_model = _name(chunk.id), _name(chunk.model)
        extra = chunk.__pydantic_extra__
        if extra and call.prompt_token_ids is None and "prompt_token_ids" in extra:
            call.prompt_token_ids = _ids(extra["prompt_token_ids"], "prompt_token_ids")
        choices = chunk.choices
        if type(choices) is not list:
            choices = _list(choices, "choices")  # raises
        if chunk.usage is not None:
            self._add_usage(chunk.usage, final=not choices)
        for choice in choices:
            acc = self._choices.get(choice.index)
            if acc is None:  # a new choice: its index is checked once
                index = _index(choice)
                acc = self._choices[index] = _StreamedChoice(index)
            acc.add(choice)

    def _add_usage(self, usage: Any, *, final: bool) -> None:
        """The stream's usage: the choice-less chunk that ends it counts all choices (final);
        usage on a chunk with choices (vLLM's ``continuous_usage_stats``) is a running count
        of one choice, kept only if no final count comes and the stream ends whole."""
        if final:
            self.call.usage = _usage(usage)
        elif self.call.usage is None:
            self._provisional_usage = _usage(usage)

    def conceal(self, chunk: Any) -> bool:
        """Whether the stream proxy must drop ``chunk``: the usage chunk arttrace asked for and
        the caller did not. It reads only ``chunk`` (call it whether or not :meth:`add_chunk`
        failed). The other chunks then carry ``usage: null`` on some servers (OpenAI's); that
        field is marked unset again, so they dump as they would have. A server that sends
        usage unasked (vLLM's ``--enable-force-include-usage`` puts it on every chunk) shows
        the caller its usage chunk too, so nothing is dropped then."""
        if not self.usage_added:
            return False
        if chunk.choices:
            if chunk.usage is not None:
                self.usage_added = False  # the server sends usage whatever was asked
            elif "usage" in chunk.model_fields_set:
                chunk.model_fields_set.discard("usage")
            return False
        return usage_only(chunk)

    def end_stream(self) -> None:
        if not self._claim():
            return
        with guarded("reassembling a stream", self._mark_unreadable):
            self.call.choices = self._streamed_choices()
            if self.call.usage is None:
                self.call.usage = self._provisional_usage
        self._close()

    def _streamed_choices(self) -> list[ChoiceRecord]:
        return [self._choices[i].record() for i in sorted(self._choices)]

    def _keep_partial(self) -> None:
        self.call.choices = self._streamed_choices()


def usage_only(chunk: Any) -> bool:
    """Whether ``chunk`` is a stream's usage chunk: no choice, a usage."""
    return getattr(chunk, "choices", None) == [] and getattr(chunk, "usage", None) is not None


def as_unasked(chunk: Any) -> bool:
    """:meth:`Capture.conceal` from ``chunk`` alone (when it failed): whether it is the usage
    chunk, to drop; any other chunk's ``usage: null`` marked unset again."""
    if usage_only(chunk):
        return True
    fields = getattr(chunk, "model_fields_set", None)
    if isinstance(fields, set) and getattr(chunk, "usage", None) is None:
        fields.discard("usage")
    return False


class Unreadable(ValueError):
    """A response field has a shape a record cannot hold."""


def _read_completion(call: LLMCall, completion: ChatCompletion | dict[str, Any]) -> None:
    """Fill ``call`` from a whole response: the messages first, so that they stay as context
    if the tokens cannot be read."""
    fields, extra = _fields(completion, "the response")
    choices = _list(fields.get("choices"), "choices")
    call.response_id, call.response_model = _name(fields.get("id")), _name(fields.get("model"))
    call.choices = [_choice_message(c) for c in choices]
    for record, choice in zip(call.choices, choices, strict=True):
        _read_tokens(record, choice)
    call.prompt_token_ids = _ids(extra.get("prompt_token_ids"), "prompt_token_ids")
    usage = fields.get("usage")
    call.usage = None if usage is None else _usage(usage)


def _fields(obj: Any, what: str) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """``obj``'s fields and its extra fields (the ones the SDK's model does not declare, such
    as vLLM's ``token_ids``), read alike from either form of a response: parsed JSON (a dict:
    both) or the SDK's object (its ``__dict__`` and ``__pydantic_extra__``, read as dicts at C
    speed). Anything else is :class:`Unreadable` (``what`` names it)."""
    if type(obj) is dict:
        return obj, obj
    try:  # a pydantic model (an isinstance check is slower: pydantic's models are ABCs)
        return obj.__dict__, obj.__pydantic_extra__ or _NO_EXTRA
    except AttributeError:
        raise Unreadable(f"{what} is {type(obj).__name__}, not an object") from None


_NO_EXTRA: Mapping[str, Any] = types.MappingProxyType({})


class _StreamedChoice:
    """One choice reassembled from stream deltas."""

    __slots__ = (
        "content",
        "finish_reason",
        "index",
        "logprobs",
        "reasoning",
        "refusal",
        "saw_logprobs",
        "token_ids",
        "tokens",
        "tool_calls",
        "top",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        self.content: list[str] = []
        self.refusal: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.logprobs = array("d")
        self.tokens: list[str] = []
        self.token_ids: array[int] | None = None
        self.top: list[list[dict[str, Any]]] = []
        self.saw_logprobs = False
        self.finish_reason: str | None = None

    def add(self, choice: Any) -> None:
        delta = choice.delta
        content, refusal = delta.content, delta.refusal
        if content:
            self.content.append(content if type(content) is str else _str(content, "content") or "")
        if refusal:
            self.refusal.append(_str(refusal, "refusal") or "")
        if delta.__pydantic_extra__:
            reasoning = _reasoning(delta.__pydantic_extra__)
            if reasoning:
                self.reasoning.append(reasoning)
        if delta.tool_calls:
            for tc in _list(delta.tool_calls, "tool_calls"):
                self._add_tool_call(tc)
        extra = choice.__pydantic_extra__
        ids = extra.get("token_ids") if extra else None
        if ids:
            if self.token_ids is None:
                self.token_ids = array("q")
            self.token_ids.extend(ids if type(ids) is list else _ids(ids, "token_ids") or ())
        logprobs = choice.logprobs
        entries = None if logprobs is None else logprobs.content
        if entries is not None:
            self.saw_logprobs = True
            if type(entries) is not list:
                entries = _list(entries, "logprobs.content")  # raises
            for token in entries:
                logprob = token.logprob
                self.logprobs.append(logprob if type(logprob) is float else _logprob(token))
                if not ids:  # the token strings matter only when the ids are not sent
                    self.tokens.append(_token(token))
                if token.top_logprobs:
                    self.top.append(_top(token))
        if choice.finish_reason:
            self.finish_reason = _str(choice.finish_reason, "finish_reason")

    def add_data(self, choice: dict[str, Any]) -> None:
        """:meth:`add` from a stream event's choice, as parsed JSON."""
        delta = choice.get("delta")
        if type(delta) is not dict:
            raise Unreadable(f"a choice delta is {type(delta).__name__}, not an object")
        content, refusal = delta.get("content"), delta.get("refusal")
        if content:
            self.content.append(content if type(content) is str else _str(content, "content") or "")
        if refusal:
            self.refusal.append(_str(refusal, "refusal") or "")
        if "reasoning" in delta or "reasoning_content" in delta:
            reasoning = _reasoning(delta)
            if reasoning:
                self.reasoning.append(reasoning)
        tool_calls = delta.get("tool_calls")
        if tool_calls:
            for tc in _list(tool_calls, "tool_calls"):
                self._add_tool_call(tc)
        ids = choice.get("token_ids")
        if ids:
            if self.token_ids is None:
                self.token_ids = array("q")
            self.token_ids.extend(ids if type(ids) is list else _ids(ids, "token_ids") or ())
        logprobs = choice.get("logprobs")
        if logprobs is not None:
            entries = (
                logprobs.get("content")
                if type(logprobs) is dict
                else _fields(logprobs, "logprobs")[0].get("content")
            )
            if entries is not None:
                self.saw_logprobs = True
                if type(entries) is not list:
                    entries = _list(entries, "logprobs.content")  # raises
                for token in entries:
                    logprob = token.get("logprob") if type(token) is dict else None
                    self.logprobs.append(logprob if type(logprob) is float else _logprob(token))
                    if not ids:  # the token strings matter only when the ids are not sent
                        self.tokens.append(_token(token))
                    if token.get("top_logprobs"):
                        self.top.append(_top(token))
        finish_reason = choice.get("finish_reason")
        if finish_reason:
            self.finish_reason = _str(finish_reason, "finish_reason")

    def _add_tool_call(self, tc: Any) -> None:
        index = _index(tc)
        slot = self.tool_calls.get(index)
        if slot is None:
            slot = self.tool_calls[index] = {"id": None, "name": [], "arguments": []}
        tool_call_id = _str(field_of(tc, "id"), "tool call id")
        if tool_call_id:
            slot["id"] = tool_call_id
        function = field_of(tc, "function")
        if function is not None:
            name = _str(field_of(function, "name"), "tool name")
            arguments = _str(field_of(function, "arguments"), "tool arguments")
            if name:
                slot["name"].append(name)
            if arguments:
                slot["arguments"].append(arguments)

    def record(self) -> ChoiceRecord:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.reasoning:
            message["reasoning"] = "".join(self.reasoning)
        if self.refusal:
            message["refusal"] = "".join(self.refusal)
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": slot["id"],
                    "type": "function",
                    "function": {
                        "name": "".join(slot["name"]),
                        "arguments": "".join(slot["arguments"]),
                    },
                }
                for _, slot in sorted(self.tool_calls.items())
            ]
        record = ChoiceRecord(index=self.index, message=message, finish_reason=self.finish_reason)
        record.token_ids = None if self.token_ids is None else compact_ids(self.token_ids)
        if self.saw_logprobs:
            record.logprobs = compact_logprobs(self.logprobs)
            _set_tokens(record, self.tokens, self.top)
        return record


def _top(token: ChatCompletionTokenLogprob | Mapping[str, Any]) -> list[dict[str, Any]]:
    alternatives = _list(field_of(token, "top_logprobs") or [], "top_logprobs")
    return [{"token": _token(t), "logprob": _logprob(t)} for t in alternatives]


def _set_tokens(record: ChoiceRecord, tokens: list[str], top: list[list[dict[str, Any]]]) -> None:
    """Token ids from ``token_id:<int>`` tokens when the server sent no ids, else the strings."""
    if tokens and record.token_ids is None:
        record.token_ids = token_ids_from_tokens(tokens)
        if record.token_ids is None:
            record.tokens = tokens
    if record.logprobs is not None and len(top) == len(record.logprobs):
        record.top_logprobs = top


def _choice_message(choice: Choice | dict[str, Any]) -> ChoiceRecord:
    fields, _ = _fields(choice, "a choice")
    m, extra = _fields(fields.get("message"), "choice message")
    message: dict[str, Any] = {"role": "assistant", "content": _str(m.get("content"), "content")}
    reasoning = _reasoning(extra) if extra else None
    if reasoning:
        message["reasoning"] = reasoning
    refusal = _str(m.get("refusal"), "refusal")
    if refusal:
        message["refusal"] = refusal
    tool_calls = m.get("tool_calls")
    if tool_calls:
        message["tool_calls"] = [_tool_call(tc) for tc in _list(tool_calls, "tool_calls")]
    return ChoiceRecord(
        index=_index(fields),
        message=message,
        finish_reason=_str(fields.get("finish_reason"), "finish_reason"),
    )


def _reasoning(extra: Mapping[str, Any]) -> str | None:
    """The reasoning text vLLM sent in a message or delta (see :data:`_REASONING_KEYS`)."""
    for key in _REASONING_KEYS:
        text = _str(extra.get(key), key)
        if text is not None:
            return text
    return None


def _tool_call(tool_call: Any) -> dict[str, Any]:
    function = field_of(tool_call, "function")
    name = field_of(function, "name")
    arguments = field_of(function, "arguments")
    if not isinstance(name, str) or not isinstance(arguments, str):
        raise Unreadable("a tool call without a function name and arguments")
    return {
        "id": _str(field_of(tool_call, "id"), "tool call id"),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _read_tokens(record: ChoiceRecord, choice: Choice | dict[str, Any]) -> None:
    fields, extra = _fields(choice, "a choice")
    record.token_ids = _ids(extra.get("token_ids"), "token_ids")
    logprobs = fields.get("logprobs")
    content = None if logprobs is None else _fields(logprobs, "logprobs")[0].get("content")
    if content is not None:
        content = _list(content, "logprobs.content")
        first = content[0] if content else None
        record.logprobs = _logprobs(content, _LOGPROB_ITEM if type(first) is dict else _LOGPROB)
        tokens = [_token(t) for t in content] if record.token_ids is None else []
        top = [_top(t) for t in content] if field_of(first, "top_logprobs") else []
        _set_tokens(record, tokens, top)


_LOGPROB = operator.attrgetter("logprob")
_LOGPROB_ITEM = operator.itemgetter("logprob")


def _logprobs(entries: list[Any], get: Callable[[Any], Any]) -> array[float]:
    """The sampled tokens' logprobs, read in one pass at C speed (``get``: an attribute or
    item getter); an entry without a float logprob is read again one by one, to accept an int
    and to name what is wrong."""
    try:
        values = list(map(get, entries))
    except (AttributeError, KeyError, TypeError):
        values = None
    if values is None or not _floats(values):
        values = [_logprob(e) for e in entries]
    return compact_logprobs(values)


def _floats(values: list[Any]) -> bool:
    """Whether every value is a ``float`` (not an int, a bool or a string)."""
    return not values or {*map(type, values)} == _FLOAT_ONLY


_FLOAT_ONLY = frozenset({float})


def _ids(raw: Any, what: str) -> array[int] | None:
    if raw is None:
        return None
    try:  # array() itself refuses what is not an int or beyond 64 bits
        ids = compact_ids(raw) if type(raw) is list else None
    except (TypeError, OverflowError):
        ids = None
    if ids is None:
        raise Unreadable(f"{what} is not a list of token ids (64-bit integers)")
    return ids


def _logprob(token: Any) -> float:
    value = token.get("logprob") if isinstance(token, Mapping) else getattr(token, "logprob", None)
    if type(value) is float:
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Unreadable(f"a logprob is {type(value).__name__}, not a number")
    return float(value)


def _token(token: Any) -> str:
    value = token.get("token") if isinstance(token, Mapping) else getattr(token, "token", None)
    return _str(value, "logprob token") or ""


def _list(value: Any, what: str) -> list[Any]:
    if type(value) is not list:
        raise Unreadable(f"{what} is {type(value).__name__}, not a list")
    return value


def _index(choice: Any) -> int:
    index = choice.get("index") if type(choice) is dict else getattr(choice, "index", None)
    if type(index) is not int:
        raise Unreadable(f"a choice index is {type(index).__name__}, not an integer")
    return index


def _str(value: Any, what: str = "a field") -> str | None:
    if value is not None and type(value) is not str:
        raise Unreadable(f"{what} is {type(value).__name__}, not a string")
    return value


def _name(value: Any) -> str | None:
    """An id or model name: any value the server sent, as text."""
    return None if value is None else str(value)


def _usage(usage: Any) -> dict[str, Any] | None:
    """The server's ``usage`` as the record keeps it: an object's fields as sent (a wrong
    type among them included), ``None`` for what is not an object (a string, a list). Only
    the token counts are read from it (:func:`._records.token_count`), so a malformed usage
    never costs the turn its ids and logprobs. ``null`` fields are left out, as the SDK's
    ``exclude_none`` dump leaves them, so every layer keeps the same usage."""
    if type(usage) is dict or isinstance(usage, Mapping):
        return _without_none(usage)

    dump = getattr(usage, "model_dump", None)
    if dump is None:
        return None
    return dict(dump(mode="json", exclude_none=True, warnings=False))


def _without_none(value: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: _without_none(v) if isinstance(v, Mapping) else v
        for k, v in value.items()
        if v is not None
    }
