"""Token continuity: whether each turn's prompt token ids extend the previous turn's prompt
and sampled ids, and how many sequences ART will train a run as.

ART 0.5.23 trains arttrace's runs (``messages_and_choices`` whose trainable turns are
``Choice`` objects carrying vLLM's ``prompt_token_ids`` and ``token_ids``) with
``art.preprocessing.tokenize.assemble_vllm_training_sequences``. It walks the trainable
Choices of the main history, then of each additional history, keeping one running sequence: a
Choice whose ``prompt_token_ids`` start with the running sequence appends the rest of its
prompt (masked) and its sampled ids (trained); any other Choice closes the sequence and starts
a new one from its whole prompt. It never renders text: the plain messages between Choices
are ignored. So a break does not make ART train on text the model never sampled; it makes
ART train the run as several sequences, each later one starting with the server's re-rendering
of the earlier turns as (untrained) prompt, and costs the compute of that repeated prefix.
:func:`continuity` replays exactly that walk on the captured records (``tests/
test_continuity.py`` holds its count equal to ART's own function).

A break inside a conversation is classified where the prompt first differs from the previous
prompt and sampled ids: inside an earlier assistant turn, the turn was re-rendered; when its
text is the same (decoded with the model's tokenizer, if one is given or found offline) the
server re-tokenised it (``retokenized``), else the chat template changed it (``template``:
reasoning dropped, tool calls re-serialised). Without a tokenizer the ids decide when they
can (ids removed or added outright change the text) and the sampled message otherwise (a turn
with reasoning or tool calls is ``template``, plain text ``retokenized``). A difference
before every known assistant turn is ``other`` (a changed system prompt, a trimmed or
summarised history). Policy turns ART does not train (most often: the server sent no token
ids) are not checked; they are counted as ``unknown``.

An agent that changes an earlier message (a timestamp in the system prompt, an edited user
message or tool result, a trimmed history, reasoning stripped from its own turn) sends
messages that extend no conversation: its call starts a conversation that *continues* the
earlier one (``arttrace.capture._conversations``: it sends back that conversation's latest
turn and keeps its first message or an edit of it). The step from the earlier conversation's
last trained turn into it is a boundary like any other, and a break (cause ``other``, the edit
named: ``system``, ``user``, ``assistant``, ``tool`` or ``trimmed``) when the prompt no longer
extends it: it costs a repeated prompt as any break does. A sub-agent (its own system prompt
and task) is a conversation of its own: its first turn is no boundary.

The causes ``template`` and ``retokenized`` are told apart by the text when a tokenizer is at
hand (given, the Trainer's, or the model's found offline; ART's LocalBackend serves the model
as ``name@step``, which the Trainer matches to its base model); else the sampled message
decides, and the break counts as ``guessed``.

The check runs when a run is converted to ART (:meth:`Trajectory.to_art`), never on the
capture path; ``bench/bench_continuity.py`` measures it.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ._conversations import Continuation, Conversation, Edit, Turn

if TYPE_CHECKING:
    import art

    from ._trajectory import Trajectory

Cause = Literal["template", "retokenized", "other"]
CAUSES: tuple[Cause, ...] = ("template", "retokenized", "other")
EDITS: tuple[Edit, ...] = ("system", "user", "assistant", "tool", "trimmed")
WARN_RATE = 0.05
"""A step whose break rate (breaks / turn boundaries checked) is above this warns."""
DOCS = "docs/continuity.md"
_log = logging.getLogger("arttrace")
Decode = Callable[[Sequence[int]], str]
"""Token ids to text, special tokens kept."""

METADATA_KEYS = (
    "continuity_boundaries",
    "continuity_breaks",
    "continuity_breaks_template",
    "continuity_breaks_retokenized",
    "continuity_breaks_other",
    "continuity_breaks_guessed",
    *(f"continuity_edits_{edit}" for edit in EDITS),
    "continuity_unknown_turns",
    "continuity_conversations",
    "art_sequences",
)
"""The keys :meth:`RunContinuity.metadata` adds to a run's ART metadata (all ints)."""


@dataclass(frozen=True, slots=True)
class Break:
    """One turn whose prompt does not extend the previous turn's prompt and sampled ids."""

    conversation: int
    """The run's conversation it is in (0: the main one, as in ``to_art()``)."""
    turn: int
    """The checked turn whose prompt broke (0-based among the conversation's trained turns;
    0 only in a conversation the agent carried on after an edit, whose first turn extends the
    earlier conversation's last: any other first turn has nothing to extend)."""
    position: int
    """The first token position where its prompt differs from the previous prompt and
    sampled ids."""
    cause: Cause
    decided_by: Literal["text", "ids", "messages", "guess"]
    """``text``: the decoded texts were compared; ``ids``: the ids alone decided (ids removed
    or added outright); ``messages``: the agent changed an earlier message (:attr:`edit`);
    ``guess``: no tokenizer was at hand and the ids could not decide, so the sampled message
    did (reasoning or tool calls: ``template``, else ``retokenized``)."""
    edit: Edit | None = None
    """What the agent changed, for a conversation it carried on after changing an earlier
    message: the first changed message's role, or ``trimmed`` (messages removed)."""


@dataclass(frozen=True, slots=True)
class RunContinuity:
    """Token continuity of one run: boundaries checked, breaks, and ART's sequences."""

    boundaries: int
    """Pairs of consecutive trained turns of one conversation that were checked."""
    breaks: tuple[Break, ...]
    unknown_turns: int
    """Policy turns ART will not train (most often: no token ids), not checked."""
    conversations: int
    """Conversations with a trained turn, a conversation the agent carried on after changing
    an earlier message counted with the one it continues: the fewest sequences ART could
    train the run as."""
    sequences: int
    """Sequences ART will train the run as (0: nothing to train)."""

    @property
    def break_rate(self) -> float:
        """Breaks per boundary checked (0.0 when there was none to check)."""
        return len(self.breaks) / self.boundaries if self.boundaries else 0.0

    def counts(self) -> dict[Cause, int]:
        """Breaks by cause, every cause present."""
        found = Counter(b.cause for b in self.breaks)
        return {cause: found[cause] for cause in CAUSES}

    def edits(self) -> dict[Edit, int]:
        """Breaks where the agent changed an earlier message, by what it changed."""
        found = Counter(b.edit for b in self.breaks if b.edit is not None)
        return {edit: found[edit] for edit in EDITS}

    def metadata(self) -> dict[str, int]:
        """What ``to_art()`` adds to the run's metadata (ART accepts scalars only)."""
        counts = self.counts()
        return {
            "continuity_boundaries": self.boundaries,
            "continuity_breaks": len(self.breaks),
            "continuity_breaks_template": counts["template"],
            "continuity_breaks_retokenized": counts["retokenized"],
            "continuity_breaks_other": counts["other"],
            "continuity_breaks_guessed": sum(b.decided_by == "guess" for b in self.breaks),
            **{f"continuity_edits_{edit}": n for edit, n in self.edits().items()},
            "continuity_unknown_turns": self.unknown_turns,
            "continuity_conversations": self.conversations,
            "art_sequences": self.sequences,
        }


def run_continuity(trajectory: Trajectory, tokenizer: Any = None) -> RunContinuity:
    """Token continuity of ``trajectory`` (an :class:`arttrace.Trajectory`), as ``to_art()``
    reports it. ``tokenizer``: the model's (anything with ``decode(ids)``, or a function of
    the ids); else one is looked for offline when a break needs it."""
    return continuity(trajectory.conversations(), tokenizer)


def continuity(conversations: Sequence[Conversation], tokenizer: Any = None) -> RunContinuity:
    """:func:`run_continuity` of a run's conversations, main one first (as ``to_art()``
    orders them)."""
    lookup = _lookup(tokenizer)
    boundaries = sequences = used = checked = 0
    unknown = sum(
        item.call.trainable
        for conversation in conversations
        for item in conversation.items
        if isinstance(item, Turn) and not item.context_only and not item.trainable
    )
    breaks: list[Break] = []
    carried_on: Continuation | None = None
    previous: Turn | None = None  # the turn this conversation's next trained turn extends
    spans: list[_Span] = []
    at = -1  # the conversation walked
    for c, item, new_sequence in art_walk(conversations):
        if c != at:
            at, carried_on, spans, checked = c, conversations[c].continues, [], 0
            previous = _last_trained(carried_on)  # what a continuation's first turn extends
        prompt, sampled = item.call.prompt_token_ids, item.choice.token_ids
        assert prompt is not None and sampled is not None  # a trained turn has both
        sequences += new_sequence
        if previous is None:
            used += 1
        else:
            boundaries += 1
            if not _extends(prompt, previous):
                if checked == 0 and carried_on is not None:
                    position = _diverges(previous, prompt)
                    breaks.append(Break(c, 0, position, "other", "messages", carried_on.edit))
                else:
                    found = _explain(previous, prompt, spans, lookup)
                    breaks.append(Break(c, checked, *found))
                    position = found[0]
                spans = [s for s in spans if s.end <= position]
        spans.append(_Span(len(prompt), len(prompt) + len(sampled), item))
        previous = item
        checked += 1
    return RunContinuity(boundaries, tuple(breaks), unknown, used, sequences)


def art_walk(conversations: Sequence[Conversation]) -> Iterator[tuple[int, Turn, bool]]:
    """ART's walk (``assemble_vllm_training_sequences``) over ``to_art()``'s histories: each
    turn it trains, in its order, as ``(conversation, turn, new_sequence)``; ``new_sequence``:
    the turn's prompt does not extend the previous trained turn's prompt and sampled ids (or
    there is none), so ART starts a new sequence with it. Token continuity counts ART's
    sequences with it, and ``arttrace.exports`` assembles them."""
    before: Turn | None = None
    for c, conversation in enumerate(conversations):
        for item in conversation.items:
            if isinstance(item, Turn) and item.trainable:
                prompt = item.call.prompt_token_ids
                assert prompt is not None  # a trained turn has its prompt's ids
                yield c, item, before is None or not _extends(prompt, before)
                before = item


def _last_trained(carried_on: Continuation | None) -> Turn | None:
    """The last trained turn a continuation carries on from: of the conversation it continues,
    up to the turn it sent back, or further back along the conversations that one continues."""
    while carried_on is not None:
        items = carried_on.of.items
        end = next(i for i, item in enumerate(items) if item is carried_on.turn)
        for item in reversed(items[: end + 1]):
            if isinstance(item, Turn) and item.trainable:
                return item
        carried_on = carried_on.of.continues
    return None


def step_continuity(runs: Iterable[Any]) -> dict[str, float]:
    """A step's continuity metrics over ``runs``: ART trajectories (``to_art()``'s, read from
    their metadata), ART groups (their trajectories; ``art_sequences`` and
    ``continuity_conversations`` then leave out the runs ART skips, those whose advantage is
    0, so that the two compare), arttrace trajectories or
    :class:`RunContinuity`."""
    totals = dict.fromkeys(METADATA_KEYS, 0)
    for run in runs:
        for key, value in _run_metadata(run):
            totals[key] += value
    boundaries, breaks = totals["continuity_boundaries"], totals["continuity_breaks"]
    return {
        "continuity_break_rate": breaks / boundaries if boundaries else 0.0,
        **{k: float(v) for k, v in totals.items()},
    }


def _run_metadata(run: Any) -> Iterable[tuple[str, int]]:
    """``(key, value)`` pairs of a run's continuity, for :func:`step_continuity`."""
    import art

    if isinstance(run, RunContinuity):
        return run.metadata().items()
    if isinstance(run, art.TrajectoryGroup):
        return _group_metadata(run)
    if isinstance(run, art.Trajectory):
        metadata = run.metadata
        return ((k, v) for k in METADATA_KEYS if isinstance(v := metadata.get(k), int))
    return run_continuity(run).metadata().items()


def _group_metadata(group: art.TrajectoryGroup) -> Iterable[tuple[str, int]]:
    """A group's runs' continuity, ``art_sequences`` counted as ART's tokenizer does: a run
    whose advantage is 0 (its reward is the group's mean, or all rewards are equal) is not
    trained (``drop_zero_advantage_trajectories``, on by default)."""
    from art.utils.grpo import rewards_have_zero_variance

    runs = group.trajectories
    rewards = [t.reward for t in runs]
    flat = rewards_have_zero_variance(rewards)
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    for t in runs:
        for key, value in _run_metadata(t):
            if key in ART_COUNTS and (flat or t.reward - mean == 0):
                continue
            yield key, value


ART_COUNTS = frozenset({"art_sequences", "continuity_conversations"})
"""The keys a step sums over the runs ART trains only (the two the warning compares)."""


def check_warn_rate(value: Any) -> float:
    """``value`` as the Trainer's ``continuity_warn_rate`` (a number from 0 to 1), or a
    ``ConfigurationError`` saying so."""
    from .._errors import ConfigurationError

    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ConfigurationError(
            "continuity_warn_rate must be a number from 0 to 1 (the share of a step's turn "
            f"boundaries that may break token continuity before it warns; 1: never), got {value!r}"
        )
    return float(value)


def warn_continuity(step: int, metrics: Mapping[str, float], threshold: float = WARN_RATE) -> bool:
    """Warn (:class:`~arttrace.TokenContinuityWarning`, once: call it once per step) when the
    step's break rate is above ``threshold``, with the most common cause (all of them, on a
    tie) and its fix. Returns whether it warned."""
    from ._warnings import TokenContinuityWarning, warn_every_time

    rate = metrics.get("continuity_break_rate", 0.0)
    if not rate > threshold:
        return False
    warn_every_time(
        f"arttrace: step {step}: {continuity_message(metrics, threshold)}",
        TokenContinuityWarning,
    )
    return True


def continuity_message(metrics: Mapping[str, float], threshold: float = WARN_RATE) -> str:
    """What :func:`warn_continuity` says about a step's ``metrics`` (its prefix aside)."""

    def n(key: str) -> int:
        return int(metrics.get(key, 0))

    breaks, rate = n("continuity_breaks"), metrics.get("continuity_break_rate", 0.0)
    counts = {c: n(f"continuity_breaks_{c}") for c in CAUSES}
    top = max(counts.values())
    causes = [c for c in CAUSES if counts[c] == top]
    if len(causes) == 1:
        named = f"Most common cause: {causes[0]} ({top} of {breaks}"
    else:
        named = f"Most common causes, tied: {' and '.join(causes)} ({top} each of {breaks}"
    edits = {e: n(f"continuity_edits_{e}") for e in EDITS}
    edited = sum(edits.values())
    changed = (
        f" {edited} of the other breaks are earlier messages the agent changed between calls ("
        + ", ".join(f"{e}: {k}" for e, k in edits.items() if k)
        + ")."
        if edited
        else ""
    )
    guessed = n("continuity_breaks_guessed")
    guess = (
        f" The cause of {guessed} of the breaks is a guess from the sampled message (no "
        "tokenizer of the model was at hand to compare texts): give the Trainer one "
        "(Trainer(tokenizer=...): a model name in the Hugging Face cache, a folder, or a "
        "tokenizer)."
        if guessed
        else ""
    )
    unknown = n("continuity_unknown_turns")
    unchecked = (
        f" {unknown} policy turns were not checked (no token ids, or otherwise not "
        "trainable): ask the server for their ids (return_token_ids)."
        if unknown
        else ""
    )
    return (
        f"{breaks} of {n('continuity_boundaries')} turn boundaries ({rate:.0%}, above "
        f"{threshold:.0%}) break token continuity: a turn's prompt token ids do not extend the "
        "previous turn's prompt and sampled ids, so ART starts a new sequence there and "
        f"repeats the prompt (the runs ART trains: {n('art_sequences')} sequences for "
        f"{n('continuity_conversations')} conversations). {named}; "
        + ", ".join(f"{c}: {k}" for c, k in counts.items())
        + f").{changed} "
        + " ".join(FIXES[c] for c in causes)
        + f"{guess}{unchecked} See {DOCS}."
    )


FIXES: dict[Cause, str] = {
    "template": (
        "The chat template re-rendered an earlier assistant turn otherwise than it was "
        "sampled: serve the model with a template that keeps each assistant turn as sampled "
        "(Qwen3 and other reasoning models: keep the reasoning of earlier turns, as ART's own "
        "server does with preserve_thinking, and send the reasoning back with the assistant "
        "message; tool calls: vLLM re-serialises their arguments as JSON with spaces, so "
        "serve with ART's server, which keeps the sampled ids of earlier turns)."
    ),
    "retokenized": (
        "The server re-tokenised an earlier assistant turn's text into other ids than it "
        "sampled: serve with a server that keeps the sampled ids of the history it renders "
        "(ART's vLLM server does), or accept the split (each sequence trains correctly, at "
        "the cost of its repeated prompt)."
    ),
    "other": (
        "Earlier context changed between turns (a changing system prompt, a trimmed or "
        "summarised history, an edited message): each change starts a new sequence; if it is "
        "deliberate, nothing is wrong."
    ),
}


# -- the walk's pieces -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Span:
    """Where a sampled turn's ids sit in the running sequence."""

    start: int
    end: int
    turn: Turn


def _extends(prompt: Sequence[int], before: Turn) -> bool:
    """ART's test: ``prompt`` starts with the previous turn's prompt and sampled ids."""
    head, sampled = before.call.prompt_token_ids, before.choice.token_ids
    assert head is not None and sampled is not None
    n, m = len(head), len(sampled)
    return len(prompt) >= n + m and prompt[:n] == head and prompt[n : n + m] == sampled


def _diverges(previous: Turn, prompt: Sequence[int]) -> int:
    """The first position where ``prompt`` leaves the previous turn's prompt and sampled ids."""
    head, sampled = previous.call.prompt_token_ids, previous.choice.token_ids
    assert head is not None and sampled is not None
    head, sampled, given = _alike(head, sampled, prompt)
    return _common_prefix(head + sampled, given)


def _explain(
    previous: Turn, prompt: Sequence[int], spans: list[_Span], lookup: Lookup
) -> tuple[int, Cause, Literal["text", "ids", "guess"]]:
    """Where ``prompt`` leaves the previous turn's prompt and sampled ids, and why."""
    head, sampled = previous.call.prompt_token_ids, previous.choice.token_ids
    assert head is not None and sampled is not None
    head, sampled, given = _alike(head, sampled, prompt)
    expected = head + sampled
    at = _common_prefix(expected, given)
    span = next((s for s in reversed(spans) if s.start <= at <= s.end), None)
    if span is None:
        return at, "other", "ids"
    if at == span.end:  # the turn is intact; what the template writes after it changed
        return at, "template", "ids"
    ours = expected[span.start : span.end]
    try:  # the re-rendered turn: up to the first of our last id (the end token) from `at` on
        end = given.index(ours[-1], at)
    except ValueError:
        return at, "other", "ids"
    theirs = given[span.start : end + 1]
    front = _common_prefix(ours, theirs)
    back = _common_prefix(ours[front:][::-1], theirs[front:][::-1])
    if front + back in (len(ours), len(theirs)):  # ids only removed or only added
        return at, "template", "ids"
    decode = lookup(span.turn)
    if decode is not None:
        try:
            same = decode(ours) == decode(theirs)
        except Exception:  # a tokenizer that cannot decode these ids: a guess
            pass
        else:
            return at, "retokenized" if same else "template", "text"
    message = span.turn.choice.message
    shaped = message.get("tool_calls") or _reasoning(message)
    return at, "template" if shaped else "retokenized", "guess"


def _alike(*ids: Sequence[int]) -> list[array[int]]:
    """``ids`` as arrays of one type: the records' own when they share one (no copy), else
    8-byte integers."""
    if all(isinstance(x, array) for x in ids) and len({x.typecode for x in ids}) == 1:  # type: ignore[attr-defined]
        return list(ids)  # type: ignore[arg-type]
    return [array("q", x) for x in ids]


def _common_prefix(a: array[int], b: array[int]) -> int:
    """Length of the common prefix of two arrays of one type: bisection on their bytes (each
    comparison a memcmp)."""
    x, y, size = a.tobytes(), b.tobytes(), a.itemsize
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if x[: mid * size] == y[: mid * size]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _reasoning(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    return bool(
        message.get("reasoning")
        or message.get("reasoning_content")
        or (isinstance(content, str) and "</think>" in content)
    )


# -- tokenizers --------------------------------------------------------------------------------

Lookup = Callable[[Turn], Decode | None]
"""The tokenizer of a turn's model, or ``None`` when there is none at hand."""


def _lookup(tokenizer: Any) -> Lookup:
    """``continuity``'s ``tokenizer`` as a lookup: a :class:`PolicyTokenizer` (the Trainer's),
    one tokenizer for every turn, or (``None``) each turn's model's found offline."""
    if isinstance(tokenizer, PolicyTokenizer):
        return tokenizer.for_turn
    decode = _as_decode(tokenizer)
    if decode is None:
        return _offline_decode
    return lambda turn: decode


def _as_decode(tokenizer: Any) -> Decode | None:
    """``tokenizer`` as a function of ids: a Hugging Face or ``tokenizers`` tokenizer, the
    viewer's ``Decoder``, or already a function."""
    if tokenizer is None:
        return None
    inner = getattr(tokenizer, "tokenizer", None)  # the viewer's Decoder wraps one
    if inner is not None and hasattr(inner, "decode"):
        tokenizer = inner
    if hasattr(tokenizer, "decode"):
        method = tokenizer.decode
        return lambda ids: str(method(list(ids), skip_special_tokens=False))
    if callable(tokenizer):
        return tokenizer  # type: ignore[no-any-return]
    raise TypeError(
        f"tokenizer must have a decode(ids) method or be a function of ids, got "
        f"{type(tokenizer).__name__}"
    )


class PolicyTokenizer:
    """The trained model's tokenizer, as the Trainer knows it: the one it was given (a model
    name in the Hugging Face cache, a folder, or a tokenizer), else its model's
    ``base_model``'s when this machine holds it (nothing is downloaded), for the turns served
    under the model's name, ``name@step`` (ART's LocalBackend) or the base model's; other
    turns' models are looked for offline. Loaded when a break first needs it (a tokenizer
    takes a second or so to load)."""

    def __init__(self, given: Any = None, model: Callable[[], Any] = lambda: None) -> None:
        named = isinstance(given, str | os.PathLike)
        self._decode = None if named else _as_decode(given)
        self.given = os.fspath(given) if named else None
        self._model = model
        """The ART model, once there is one (a factory builds it later)."""

    @classmethod
    def for_trainer(cls, given: Any, model: Callable[[], Any]) -> PolicyTokenizer:
        """``Trainer(tokenizer=given)`` for the ART model ``model()`` gives, or a
        ``ConfigurationError`` saying what is wrong with ``given``."""
        from .._errors import ConfigurationError

        if isinstance(given, str | os.PathLike):
            from .._tokenizers import _find

            folder, wrong = _find.locate(os.fspath(given))
            if folder is None:
                reason = wrong.split(": ", 1)[-1].replace("the viewer never", "arttrace never")
                raise ConfigurationError(f"Trainer(tokenizer={os.fspath(given)!r}): {reason}")
        elif given is not None and not (hasattr(given, "decode") or callable(given)):
            raise ConfigurationError(
                "Trainer(tokenizer=...) takes the model's tokenizer: a model name in the "
                "Hugging Face cache, a folder holding it, a tokenizer (transformers or "
                f"tokenizers), or a function of token ids to text; got {type(given).__name__}"
            )
        return cls(given, model)

    def served(self, model: str) -> bool:
        """``model`` is the trained model as a server names it: its name, ``name@step``, or
        its base model."""
        art_model = self._model()
        name, base = getattr(art_model, "name", None), getattr(art_model, "base_model", None)
        if isinstance(base, str) and model == base:
            return True
        return (
            isinstance(name, str) and re.fullmatch(re.escape(name) + r"(@\d+)?", model) is not None
        )

    def for_turn(self, turn: Turn) -> Decode | None:
        if self._decode is not None:
            return self._decode
        if self.given is not None:
            return _decoder_named(self.given, warn=True)
        base = getattr(self._model(), "base_model", None)
        names = [n for n in (turn.call.response_model, turn.call.model) if n]
        if isinstance(base, str) and base and any(self.served(n) for n in names):
            decode = _decoder_named(base)
            if decode is not None:
                return decode
        return _offline_decode(turn)


def _offline_decode(turn: Turn) -> Decode | None:
    """The tokenizer of the turn's model, if this machine holds it (a local folder, or the
    Hugging Face cache; never downloaded): the viewer's lookup. A name served as
    ``model@step`` is also tried without its step."""
    call = turn.call
    names = [n for n in (call.response_model, call.model) if n]
    names += [n.rsplit("@", 1)[0] for n in names if re.search(r"@\d+$", n)]
    for name in dict.fromkeys(names):
        decode = _decoder_named(name)
        if decode is not None:
            return decode
    return None


@functools.lru_cache(maxsize=16)
def _decoder_named(name: str, warn: bool = False) -> Decode | None:
    """Loaded once per model name and process (a tokenizer takes a second or so to load).
    ``warn``: a tokenizer the user named that fails to load is logged (once), not silent."""
    try:
        from pathlib import Path

        from .._tokenizers import _find

        path = Path(name).expanduser()
        folder = path if path.is_dir() else _find.cached_folder(name)
        if folder is None:
            if warn:
                _log.warning(
                    "arttrace: the tokenizer %s is not a folder here nor in the Hugging Face "
                    "cache; token continuity guesses the causes of breaks without it",
                    name,
                )
            return None
        return _as_decode(_find.load(_find.Found(str(folder), name, "continuity")))
    except Exception as error:  # no tokenizer here: the ids, then the messages, decide
        if warn:
            _log.warning(
                "arttrace: the tokenizer %s cannot be loaded (%s); token continuity guesses "
                "the causes of breaks without it",
                name,
                error,
            )
        return None
