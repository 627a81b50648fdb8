"""One call, seen by two layers, kept once.

A framework's call to an OpenAI-compatible server (LangChain's ``ChatOpenAI``, LlamaIndex's
``OpenAI``, ADK's ``LiteLlm``) is seen by the framework's callbacks and, below them, by a layer
that reads the request itself: the OpenAI shim (``source == "openai"``) or, for a client
arttrace does not wrap (ADK's ``LiteLlm("hosted_vllm/...")``, LiteLLM, DSPy), the HTTP-client
layer (``source == "http"``); for a call to a run's URL, the gateway (``source ==
"gateway"``). The lower record has the exact request and tokens; the framework's has its
names. :func:`merge_layers` pairs them and keeps the lower record, named by the framework. No
two lower layers record one call: the HTTP layer stands aside while a captured SDK call runs
(``_context.capturing``), and both stand aside for a gateway of this process
(``_context.records_itself``).

A framework record and a lower record are the same call when the lower call started while the
framework's was open and both produced the same response: the same response id, or the same
first message (role, text, tool calls and their arguments).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ._conversations import message_key
from ._records import LLMCall

LOWER_LAYERS = frozenset({"openai", "http", "gateway"})
"""The sources of records read off the request itself (exact tokens): the SDK shim's, the
HTTP layer's and the gateway's. Any other source is a framework's."""


def merge_layers(calls: Iterable[LLMCall]) -> list[LLMCall]:
    """``calls`` in start order, each framework record folded into its lower-layer record."""
    ordered = sorted(calls, key=lambda c: c.seq)
    pairs = _pairs(ordered)
    for framework_call, match in pairs:
        match.framework = framework_call.source
        match.step = match.step or framework_call.step
        match.trainable = match.trainable or framework_call.trainable
        match.agent = match.agent or framework_call.agent
    dropped = {framework_call.seq for framework_call, _ in pairs}
    return [c for c in ordered if c.seq not in dropped]


def is_paired(framework_call: LLMCall, records: Iterable[LLMCall]) -> bool:
    """Whether the merge would fold ``framework_call`` into a lower-layer record among
    ``records``."""
    ordered = sorted([*records, framework_call], key=lambda c: c.seq)
    return any(f is framework_call for f, _ in _pairs(ordered))


def _pairs(ordered: list[LLMCall]) -> list[tuple[LLMCall, LLMCall]]:
    """(framework record, lower record) of each call both layers saw, ``ordered`` by start."""
    sdk = [c for c in ordered if c.source in LOWER_LAYERS]
    claimed: set[int] = set()
    pairs = []
    for framework_call in (c for c in ordered if c.source not in LOWER_LAYERS):
        match = next(
            (
                s
                for s in sdk
                if s.seq not in claimed
                and s.seq > framework_call.seq
                and s.started_at <= (framework_call.ended_at or math.inf)
                and same_response(framework_call, s)
            ),
            None,
        )
        if match is not None:
            claimed.add(match.seq)
            pairs.append((framework_call, match))
    return pairs


def same_response(framework_call: LLMCall, sdk_call: LLMCall) -> bool:
    if framework_call.response_id and framework_call.response_id == sdk_call.response_id:
        return True
    if not framework_call.choices:  # the framework saw no response: the call failed
        return not sdk_call.choices or sdk_call.error is not None
    if not sdk_call.choices:
        return False
    return message_key(framework_call.choices[0].message) == message_key(
        sdk_call.choices[0].message
    )
