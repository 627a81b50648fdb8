"""The pieces of a Chat Completions record that every framework builds from its own objects:
tool calls, tool specs and usage, each in the OpenAI wire form."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def json_text(value: Any) -> str:
    """``value`` as JSON text, as the frameworks' OpenAI clients send it (non-ASCII kept); its
    ``str`` when it has no JSON form."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, OverflowError, RecursionError):
        return str(value)


def tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    """A tool call as an assistant message carries it: ``arguments`` as a JSON string (a
    framework's parsed arguments are serialised; ``None`` is ``{}``)."""
    if not isinstance(arguments, str):
        arguments = json_text(arguments if arguments is not None else {})
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name or "", "arguments": arguments},
    }


def function_tool(name: Any, description: Any, parameters: Any) -> dict[str, Any]:
    """A tool spec (``tools`` entry) for a function with a JSON-schema ``parameters``."""
    return {
        "type": "function",
        "function": {
            "name": name or "",
            "description": description or "",
            "parameters": parameters if parameters else {"type": "object", "properties": {}},
        },
    }


def tool_specs(
    tools: Iterable[Any] | None, convert: Callable[[Any], Mapping[str, Any] | None]
) -> list[dict[str, Any]] | None:
    """The tools of a call in OpenAI form. ``convert`` turns the framework's own tool objects
    into OpenAI specs (``None``: not one of them); then OpenAI specs are kept, Anthropic-style
    ones (``name`` and ``input_schema``) converted, and anything else kept as given."""
    out: list[dict[str, Any]] = []
    for tool in tools or ():
        try:
            spec = convert(tool)
        except Exception:  # a provider's built-in tool with no OpenAI form
            spec = None
        if spec is None and isinstance(tool, Mapping):
            if tool.get("type") == "function" and "function" in tool:
                spec = tool
            elif "name" in tool:
                schema = tool.get("input_schema") or tool.get("parameters") or {}
                spec = function_tool(tool["name"], tool.get("description"), schema)
            else:
                spec = tool
        out.append(dict(spec) if spec is not None else {"tool": repr(tool)})
    return out or None


def token_logprob(token: Any, logprob: Any, top: Iterable[tuple[Any, Any]] = ()) -> dict[str, Any]:
    """One sampled token's entry in OpenAI-form logprobs (``logprobs.content[i]``), with its
    ``top`` alternatives as ``(token, logprob)`` pairs."""
    return {
        "token": token,
        "logprob": logprob,
        "top_logprobs": [{"token": t, "logprob": lp} for t, lp in top],
    }


def usage(prompt: Any, completion: Any, total: Any = None) -> dict[str, int] | None:
    """A Chat Completions ``usage`` from a framework's token counts (those it has)."""
    counts = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}
    return {k: int(v) for k, v in counts.items() if isinstance(v, int | float)} or None


def usage_of(value: Any) -> dict[str, Any] | None:
    """A ``usage`` the framework kept in OpenAI form (a mapping or the SDK's object)."""
    if isinstance(value, Mapping):
        return {k: v for k, v in value.items() if v is not None} or None
    dump = getattr(value, "model_dump", None)
    return (dict(dump(exclude_none=True)) or None) if callable(dump) else None
