"""The Responses API (``/v1/responses``): one parser for a call seen by the OpenAI SDK shim
(typed objects, dumped to JSON form) and for one read off the wire (the gateway, the HTTP
layer): the request's input items, the server's response or its stream events.

**When a Responses turn is trainable.** ART trains a turn on the exact prompt ids and sampled
ids (with their logprobs) of *one* generation. The response carries them in one of two forms:

* ``token_generations`` (the carrier ART 0.5.23 reads, ``art/trajectories/_tokenize.py``,
  supplied by patched vLLM/SGLang servers): one generation with ``prompt_token_ids``,
  ``token_ids`` and logprobs (``output_tokens`` ``[{"token_id", "logprob"}]``, or a ``logprobs``
  list). A response that ran several generations (server-side tool loops) has no single prompt.
* **stock vLLM**, asked with ``enable_response_messages: true`` (vLLM's extension) and
  ``include: ["message.output_text.logprobs"]``: ``input_messages[0].tokens`` are the prompt
  ids, ``output_messages[0].tokens`` the sampled ids (``raw_message_tokens``; one entry each
  when one generation ran), and the logprobs of the whole generation sit on the message's
  ``output_text`` (vLLM attaches them there, tool-call tokens included; the final
  ``response.completed`` event of a stream carries the same). vLLM drops them when the turn is
  only a function call (no text item to carry them), so such a turn has no logprobs and is
  kept as context. Logprob tokens ``token_id:<n>`` alone give ids but no prompt: not enough.
  Raw ids whose count differs from the server's ``usage.output_tokens`` (several generations,
  or a vLLM whose final streamed response kept only the last delta) are not trusted.

On ``@trainable`` calls arttrace asks for both vLLM fields (sampling parameters untouched;
``instrument(request_training_data=False)`` turns this off). A turn without exact tokens is
kept as context, and the first per run and model warns
(:class:`~arttrace.UntrainableTurnWarning`), naming what is missing and the fix. The record is
a Chat Completions-shaped :class:`~._records.LLMCall`: input items become messages
(``function_call`` items an assistant's ``tool_calls``, ``function_call_output`` items ``tool``
messages, ``reasoning`` items the assistant's ``reasoning``), so conversion to ART is the chat
path's.

``previous_response_id``: the model saw the chain's earlier turns, so the record's messages
start with them when the earlier turn was recorded in this run; when it was not (or the call
names a server-side ``conversation``), the record says so (``params["arttrace_context"]``) and
the first such call per model warns.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import openai
import orjson

from . import _context
from ._calls import OpenCall, Settings
from ._guard import guarded
from ._records import (
    ChoiceRecord,
    LLMCall,
    compact_ids,
    compact_logprobs,
    jsonable,
    token_count,
    token_ids_from_tokens,
)
from ._redact import UpstreamError, excerpt, remember_client
from ._warnings import _warn_once, fix_for

if TYPE_CHECKING:
    from ._trajectory import Trajectory

LOGPROBS_INCLUDE = "message.output_text.logprobs"
RESPONSE_MESSAGES = "enable_response_messages"
FUNCTION_CALL_ONLY = "a Responses API turn that is only a function call: token ids, no logprobs"
FUNCTION_CALL_FIX = (
    "vLLM attaches a Responses turn's logprobs to its output text, so a turn that is only a "
    "function call (a tool call or a handoff) comes with its token ids but no logprobs, and ART "
    "cannot train it. Turn on translation (instrument(translate='responses'), or arttrace "
    "gateway --translate responses; docs/translation.md): arttrace then makes each call "
    "through Chat Completions, whose tool-call turns carry logprobs, and answers in the "
    "Responses API. Or call the model through Chat Completions yourself (for the OpenAI Agents "
    "SDK: OpenAIChatCompletionsModel), or serve it with a server that returns token_generations."
)
RESPONSES_FIX = (
    "ART trains a turn on the exact prompt and sampled token ids, which a Responses API "
    "server returns only when asked: serve the policy with vLLM, which returns them for "
    "enable_response_messages=true with include=['message.output_text.logprobs'] (arttrace "
    "asks for both on @trainable calls unless request_training_data=False; vLLM gives no "
    "logprobs for a turn that is only a function call), or with a server that returns "
    "token_generations. Otherwise turn on translation (instrument(translate='responses'), or "
    "arttrace gateway --translate responses; docs/translation.md), or call the model through "
    "Chat Completions (for the OpenAI Agents SDK: OpenAIChatCompletionsModel)."
)
_TOKEN_REASONS = frozenset(
    {"no logprobs", "no token ids", "token ids and logprobs differ in length"}
)
_NOT_PARAMS = frozenset(
    {"input", "instructions", "tools", "model", "extra_headers", "extra_query", "timeout"}
)
_SENTINELS = (openai.NotGiven, openai.Omit)
_TERMINAL = frozenset({"response.completed", "response.incomplete"})
_FAILED = frozenset({"response.failed", "error"})


def given(value: Any) -> bool:
    return value is not None and not isinstance(value, _SENTINELS)


def with_training_fields(body: dict[str, Any], *, sdk: bool) -> dict[str, Any]:
    """``body`` asking for the logprobs (``include``) and vLLM's raw token ids
    (``enable_response_messages``) unless the caller set them; ``sdk``: the SDK's keyword
    arguments (vLLM's field goes in ``extra_body``), else a JSON body."""
    out = dict(body)
    include = list(out["include"]) if given(out.get("include")) else []
    if LOGPROBS_INCLUDE not in include:
        out["include"] = [*include, LOGPROBS_INCLUDE]
    if not sdk:
        out.setdefault(RESPONSE_MESSAGES, True)
        return out
    extra_body = out.get("extra_body")
    extra = dict(extra_body) if isinstance(extra_body, Mapping) else {}
    if RESPONSE_MESSAGES not in extra:
        out["extra_body"] = {**extra, RESPONSE_MESSAGES: True}
    return out


class ResponsesCall(OpenCall):
    """One Responses API call. Fed by the shim (:meth:`complete` with the SDK's ``Response``,
    :meth:`add_chunk` with its stream events) or by a wire layer (:meth:`whole`,
    :meth:`event` with bytes); both end in :func:`read_response`. ``body`` is what to send:
    on a policy call, with the training fields (see :func:`with_training_fields`)."""

    __slots__ = ("_items", "_text", "body", "kwargs")

    def __init__(
        self, body: dict[str, Any], settings: Settings, server: Any, *, sdk: bool = False
    ) -> None:
        model = str(body.get("model", ""))
        trajectory = _context.current_trajectory_var.get()
        scope = _context.policy_scope(model) if trajectory is not None else None
        if scope is not None and settings.request_training_data:
            body = with_training_fields(body, sdk=sdk)
        items = body.get("input")
        if isinstance(items, Iterable) and not isinstance(items, str | list | Mapping):
            body = {**body, "input": list(items)}  # an iterator would be used up by the record
        self.body = self.kwargs = body
        remember_client(server, [body.get("extra_headers"), body.get("extra_query")])
        call = LLMCall(
            model=model,
            messages=[],
            params={k: jsonable(v) for k, v in body.items() if k not in _NOT_PARAMS and given(v)},
            trainable=scope is not None,
            agent=scope.name if scope else None,
            policy=scope.policy if scope else None,
            streamed=bool(body.get("stream")),
        )
        self._items: list[dict[str, Any]] = []
        self._text: list[str] = []
        super().__init__(call, trajectory, settings.export_tokens, server)
        with guarded("reading a Responses request", self._mark_unreadable):
            call.tools = chat_tools(body.get("tools"))
            call.messages = self._messages(body, trajectory)

    def _messages(
        self, body: dict[str, Any], trajectory: Trajectory | None
    ) -> list[dict[str, Any]]:
        instructions = body.get("instructions")
        system = (
            [{"role": "system", "content": instructions}] if isinstance(instructions, str) else []
        )
        skipped: list[str] = []
        turn = input_messages(body.get("input"), skipped)
        if skipped:
            self.call.params["arttrace_skipped_items"] = skipped
        previous, conversation = body.get("previous_response_id"), body.get("conversation")
        if given(conversation):  # the Conversations API: the server holds the earlier items
            self._unrecorded(f"conversation {jsonable(conversation)!r}")
            return system + turn
        if not given(previous):
            return system + turn
        earlier = _recorded(trajectory, str(previous))
        if earlier is None:
            self._unrecorded(f"previous_response_id {previous!r}")
            return system + turn
        history = [m for m in earlier.messages if m.get("role") != "system"]
        said = [earlier.choices[0].message] if earlier.choices else []
        return system + history + said + turn

    def _unrecorded(self, what: str) -> None:
        """The model saw earlier turns this run did not record (``what`` names them)."""
        self.call.params["arttrace_context"] = (
            f"{what} was not recorded in this run: the messages start at this turn's input, "
            "the model saw more"
        )
        if self.call.trainable:
            _warn_chain(self.call.model, what)

    # -- the SDK's objects -----------------------------------------------------------------

    def complete(self, response: Any) -> None:
        """The whole response (the SDK's ``Response``, or its JSON form)."""
        if not self._claim():
            return
        with guarded("reading a Responses response", self._mark_unreadable):
            read_response(self.call, _plain(response))
        self._close()

    def add_chunk(self, event: Any) -> None:
        """One stream event (the SDK's object, or its JSON form)."""
        if self._done:
            return
        kind = _field(event, "type")
        if kind == "response.output_text.delta":
            self._text.append(str(_field(event, "delta") or ""))
        elif kind == "response.output_item.done":
            self._items.append(_plain(_field(event, "item")))
            self._text = []
        elif kind in _TERMINAL:
            self.complete(_field(event, "response"))
        elif kind in _FAILED:
            self.fail(UpstreamError(f"the server sent {_error_text(event)}"), partial=True)

    def end_stream(self) -> None:
        self.abandon("the stream ended without a response.completed event")

    def _keep_partial(self) -> None:
        """What arrived of a stream that did not finish, as context."""
        items = list(self._items)
        if self._text:
            items.append(
                {
                    "type": "message",
                    "content": [{"type": "output_text", "text": "".join(self._text)}],
                }
            )
        if items:
            self.call.choices = [ChoiceRecord(0, assistant_message(items), None)]

    # -- the wire's bytes ------------------------------------------------------------------

    def whole(self, status: int, data: bytes) -> None:
        if self.refused(status, data):
            return
        with guarded("reading a Responses response", self.lost):
            self.complete(orjson.loads(data))

    def event(self, data: bytes) -> None:
        if self._done:
            return
        with guarded("reading a Responses stream", self.lost):
            event = orjson.loads(data)
            if isinstance(event, dict):
                self.add_chunk(event)

    def ended(self) -> None:
        self.end_stream()

    def failed(self, error: BaseException, *, partial: bool) -> None:
        self.fail(error, partial=partial)

    def abandoned(self, why: str) -> None:
        self.abandon(why)

    # -- the one warning -------------------------------------------------------------------

    def _warn_untrainable(self) -> None:
        call = self.call
        if call.capture_error or not call.choices:
            super()._warn_untrainable()
            return
        reason = call.untrainable_reason(call.choices[0])
        if reason in _TOKEN_REASONS:
            self._warn(*_without_exact_tokens(call, call.choices[0]))
        elif reason is not None:
            self._warn(reason)


def _without_exact_tokens(call: LLMCall, choice: ChoiceRecord) -> tuple[str, str]:
    """The cause of a Responses turn that lacks exact tokens, naming what it lacks, and its
    fix."""
    missing = [
        name
        for name, value in (
            ("prompt token ids", call.prompt_token_ids),
            ("sampled token ids", choice.token_ids),
            ("logprobs", choice.logprobs),
        )
        if value is None
    ]
    if not missing:
        reason = "token ids and logprobs differ in length"
        return f"a Responses API turn whose {reason}", fix_for(reason)
    if (
        missing == ["logprobs"]
        and choice.message.get("tool_calls")
        and not choice.message.get("content")
    ):
        return FUNCTION_CALL_ONLY, FUNCTION_CALL_FIX
    listed = ", ".join(missing[:-1]) + (" and " if len(missing) > 1 else "") + missing[-1]
    return f"a Responses API turn without {listed}", RESPONSES_FIX


# -- reading a response ---------------------------------------------------------------------


def read_response(call: LLMCall, response: dict[str, Any]) -> None:
    """Fill ``call`` from a Responses ``response`` (JSON form): the message first, so that it
    stays as context if the tokens cannot be read."""
    call.response_id, call.response_model = _name(response.get("id")), _name(response.get("model"))
    usage = response.get("usage")
    call.usage = dict(usage) if isinstance(usage, Mapping) else None
    items = [i for i in response.get("output") or () if isinstance(i, Mapping)]
    message = assistant_message(items)
    status = response.get("status")
    if status in ("failed", "cancelled"):
        call.error = f"the response ended {status}: {_error_text(response.get('error'))}"
    record = ChoiceRecord(0, message, _finish_reason(response, message))
    call.choices = [record]
    prompt, ids, logprobs, tokens, top = _exact_tokens(response, items)
    call.prompt_token_ids = prompt
    record.token_ids = ids
    if logprobs is not None:
        record.logprobs = logprobs
        if ids is None and tokens:
            record.token_ids = token_ids_from_tokens(tokens)
            if record.token_ids is None:
                record.tokens = tokens
        if top and len(top) == len(logprobs):
            record.top_logprobs = top


def _finish_reason(response: Mapping[str, Any], message: Mapping[str, Any]) -> str | None:
    status = response.get("status")
    if status == "completed":
        return "tool_calls" if message.get("tool_calls") else "stop"
    if status == "incomplete":
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, Mapping) else None
        return {"max_output_tokens": "length", "content_filter": "content_filter"}.get(str(reason))
    return None


type Tokens = tuple[
    array[int] | None, array[int] | None, array[float] | None, list[str], list[list[dict[str, Any]]]
]


def _exact_tokens(response: Mapping[str, Any], items: list[Mapping[str, Any]]) -> Tokens:
    """(prompt ids, sampled ids, logprobs, logprob token strings, alternatives) of the one
    generation, from ``token_generations`` or from vLLM's raw messages and content logprobs."""
    generations = response.get("token_generations")
    if isinstance(generations, list):
        if len(generations) != 1 or not isinstance(generations[0], Mapping):
            return None, None, None, [], []
        return _generation(generations[0])
    entries = [
        entry
        for item in items
        if item.get("type") == "message"
        for part in item.get("content") or ()
        if isinstance(part, Mapping) and isinstance(part.get("logprobs"), list)
        for entry in part["logprobs"]
    ]
    logprobs = compact_logprobs([float(e["logprob"]) for e in entries]) if entries else None
    tokens = [str(e.get("token", "")) for e in entries]
    top = [
        [
            {"token": a.get("token"), "logprob": a.get("logprob")}
            for a in e.get("top_logprobs") or ()
        ]
        for e in entries
    ]
    prompt = _raw_tokens(response.get("input_messages"))
    ids = _raw_tokens(response.get("output_messages"))
    usage = response.get("usage")
    counted = token_count(usage.get("output_tokens")) if isinstance(usage, Mapping) else None
    if ids is not None and counted is not None and counted != len(ids):
        return None, None, None, [], []  # the ids are not the whole turn's: trust none of it
    return prompt, ids, logprobs, tokens, top if any(top) else []


def _generation(generation: Mapping[str, Any]) -> Tokens:
    prompt = _ids(generation.get("prompt_token_ids"))
    ids = _ids(generation.get("token_ids"))
    pairs = generation.get("output_tokens")
    logprobs: array[float] | None = None
    if isinstance(pairs, list) and pairs:
        if ids is None:
            ids = _ids([p.get("token_id") for p in pairs])
        logprobs = compact_logprobs([float(p["logprob"]) for p in pairs])
    elif isinstance(generation.get("logprobs"), list):
        logprobs = compact_logprobs([float(v) for v in generation["logprobs"]])
    return prompt, ids, logprobs, [], []


def _raw_tokens(messages: Any) -> array[int] | None:
    """vLLM's ``raw_message_tokens`` list: the ids of its one entry (more entries: several
    generations ran, none is the turn's own)."""
    if not isinstance(messages, list) or len(messages) != 1 or not isinstance(messages[0], Mapping):
        return None
    return _ids(messages[0].get("tokens"))


def _ids(raw: Any) -> array[int] | None:
    if not isinstance(raw, list):
        return None
    return compact_ids(raw)  # refuses what is not a 64-bit int: the read is guarded


# -- input items and output items as chat messages -------------------------------------------


def input_messages(items: Any, skipped: list[str] | None = None) -> list[dict[str, Any]]:
    """A Responses ``input`` as chat messages: a string is the user's message; consecutive
    assistant items (text, ``function_call``, ``reasoning``) make one assistant message. Items
    with no chat form (a server-side tool's call, an ``item_reference``) are left out, their
    types appended to ``skipped``."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    turn: list[dict[str, Any]] = []  # the assistant items not yet folded into a message

    def flush() -> None:
        if turn:
            messages.append(assistant_message(turn))
            turn.clear()

    for raw in items if isinstance(items, list | tuple) else ():
        item = _plain(raw)
        kind = item.get("type", "message")
        if kind in ("function_call", "reasoning") or (
            kind == "message" and item.get("role") == "assistant"
        ):
            if kind == "reasoning" and turn:
                flush()  # reasoning opens an assistant turn
            turn.append(item)
            continue
        flush()
        if kind == "function_call_output":
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": _text(item.get("output")),
                }
            )
        elif kind == "message":
            messages.append(
                {"role": item.get("role", "user"), "content": _content(item.get("content"))}
            )
        elif skipped is not None:
            skipped.append(str(kind))
    flush()
    return messages


def assistant_message(items: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Output items (or an input's assistant items) as one chat assistant message."""
    text: list[str] = []
    refusal: list[str] = []
    reasoning: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            content = item.get("content")
            if isinstance(content, str):
                text.append(content)
            for part in content if isinstance(content, list) else ():
                if isinstance(part, Mapping):
                    if part.get("type") == "refusal":
                        refusal.append(str(part.get("refusal") or ""))
                    elif isinstance(part.get("text"), str):
                        text.append(part["text"])
        elif kind == "function_call":
            tool_calls.append(
                {
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")},
                }
            )
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or ()
            reasoning += [str(p.get("text") or "") for p in parts if isinstance(p, Mapping)]
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
    if refusal:
        message["refusal"] = "".join(refusal)
    if reasoning:
        message["reasoning"] = "".join(reasoning)
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Responses function tools in the Chat Completions form ART's histories hold
    (``{"type": "function", "function": {...}}``); other tools as they came."""
    if not given(tools) or not isinstance(tools, list | tuple):
        return None
    out = []
    for raw in tools:
        tool = _plain(raw)
        if tool.get("type") == "function" and "function" not in tool:
            function = {k: v for k, v in tool.items() if k != "type"}
            out.append({"type": "function", "function": function})
        else:
            out.append(tool)
    return out


def _content(content: Any) -> Any:
    """Message content: text parts as one string; other parts (images, files) in chat form."""
    if not isinstance(content, list):
        return content
    parts = [_plain(p) for p in content]
    if all(isinstance(p.get("text"), str) for p in parts):
        return "".join(p["text"] for p in parts)
    chat: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part.get("text"), str):
            chat.append({"type": "text", "text": part["text"]})
        elif part.get("type") == "input_image" and part.get("image_url"):
            chat.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            chat.append(part)
    return chat


def _text(output: Any) -> Any:
    """A function call's output: a string, or its text parts joined."""
    if isinstance(output, list):
        return _content(output)
    return output


# -- helpers ----------------------------------------------------------------------------------


def _recorded(trajectory: Trajectory | None, response_id: str) -> LLMCall | None:
    """The record of the run's call whose response was ``response_id``."""
    if trajectory is None:
        return None
    for call in reversed(list(trajectory.call_log.records)):
        if call.response_id == response_id:
            return call
    return None


def _warn_chain(model: str, what: str) -> None:
    _warn_once(
        (model, "previous_response_id"),
        f"arttrace: a @trainable Responses call to model {model!r} continues {what}, which "
        "was not recorded in this run, so its record starts at this turn's input (the "
        "server's token ids still cover the whole chain). Make the chain's earlier calls "
        "inside the same trajectory, or send the whole conversation as input.",
        UserWarning,
    )


def _plain(value: Any) -> dict[str, Any]:
    """An SDK object or a mapping as a JSON-form dict (extras, such as vLLM's, included)."""
    if isinstance(value, Mapping):
        return dict(value)
    dump = getattr(value, "model_dump", None)
    if dump is None:
        raise TypeError(f"arttrace cannot read a {type(value).__name__} as a Responses item")
    return dict(dump(mode="json", exclude_none=True, warnings=False))


def _field(value: Any, name: str) -> Any:
    return value.get(name) if isinstance(value, Mapping) else getattr(value, name, None)


def _name(value: Any) -> str | None:
    return None if value is None else str(value)


def _error_text(value: Any) -> str:
    try:
        data = orjson.dumps(_plain(value)) if value is not None else b"no detail"
    except (TypeError, orjson.JSONEncodeError):
        data = repr(value).encode()
    return excerpt(data)
