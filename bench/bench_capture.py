"""How much arttrace's capture costs: time per call and memory per captured token.

    python bench/bench_capture.py            # about 1-2 minutes on 2 cores
    python bench/bench_capture.py --quick    # about 20 seconds, rougher figures

Every call goes to the same in-process ``ScriptedLLM`` transport (an ``httpx.MockTransport``
answering like vLLM) and gets a 256-token completion with logprobs and token ids; streams
send one token per chunk and are read to the end. Three questions, each with a target:

(a) an instrumented call (inside ``with at.trajectory(...)`` and a ``@at.trainable`` function)
    against the same call with arttrace uninstrumented: ratio of wall times, target <= 1.10;
(b) arttrace's capture overhead against ART's own capture (``with art.Trajectory():``, which
    patches httpx and re-parses each response): overhead ratio, target < 1.0;
(c) memory the captured trajectories retain, per completion token, target <= 64 bytes.

It prints figures and PASS/MISS markers and always exits 0 (a failed sanity check is shown
as such but does not stop the run); it is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import art
import httpx
import openai

import arttrace as at
from arttrace.testing import Reply, ScriptedLLM, SimpleChatTokenizer

MODEL = "policy-model"
COMPLETION_TOKENS = 256
# SimpleChatTokenizer splits words and spaces apart: 128 words + 127 spaces = 255 tokens, and
# the end token <|im_end|> makes 256 sampled tokens.
CONTENT = " ".join(f"w{i}" for i in range(128))
PROMPT = "Hi"  # short on purpose: the request messages are retained with the trajectory too

TARGET_RATIO = 1.10
TARGET_ART_RATIO = 1.0
TARGET_BYTES_PER_TOKEN = 64.0

ARMS = ("baseline", "arttrace", "baseline+ART patch", "ART capture")
# Which httpx (original or with ART's capture patch) and whether arttrace is instrumented.
ARM_SETUP = {
    "baseline": (False, False),
    "arttrace": (False, True),
    "baseline+ART patch": (True, False),
    "ART capture": (True, False),
}


# -- the workload ----------------------------------------------------------------------------


def _create_kwargs(stream: bool) -> dict[str, Any]:
    """A fresh request each call, as an agent builds it (the record keeps its own copies)."""
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "logprobs": True,
        "extra_body": {"return_token_ids": True},
    }
    if stream:
        kwargs["stream"] = True
        kwargs["stream_options"] = {"include_usage": True}
    return kwargs


def sync_call(client: openai.OpenAI, stream: bool) -> int | None:
    """One call; the completion token count the server reported."""
    if not stream:
        completion = client.chat.completions.create(**_create_kwargs(False))
        return completion.usage.completion_tokens if completion.usage else None
    tokens = None
    for chunk in client.chat.completions.create(**_create_kwargs(True)):
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return tokens


async def async_call(client: openai.AsyncOpenAI, stream: bool) -> int | None:
    if not stream:
        completion = await client.chat.completions.create(**_create_kwargs(False))
        return completion.usage.completion_tokens if completion.usage else None
    tokens = None
    async for chunk in await client.chat.completions.create(**_create_kwargs(True)):
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return tokens


def check_content_tokens() -> None:
    completion = SimpleChatTokenizer().completion(
        [], None, {"role": "assistant", "content": CONTENT}
    )
    if len(completion.token_ids) != COMPLETION_TOKENS:
        raise SystemExit(
            f"the reply is {len(completion.token_ids)} tokens, not {COMPLETION_TOKENS}"
        )


# -- ART's httpx patch, switchable -----------------------------------------------------------

_PATCHED_ATTRS = (
    (httpx.Client, "send"),
    (httpx.AsyncClient, "send"),
    (httpx.Response, "iter_raw"),
    (httpx.Response, "aiter_raw"),
    (httpx.Response, "close"),
    (httpx.Response, "aclose"),
)


class ARTPatch:
    """ART installs its httpx capture once, for good, the first time a trajectory is entered.

    To interleave the arms (and so compare baselines measured side by side), keep both sets
    of httpx methods and swap them between blocks: the arms before ART's patch run on the
    original httpx, ART's arms on the patched one.
    """

    def __init__(self) -> None:
        if getattr(httpx.Client.send, "_art_capture", False):
            raise SystemExit("ART's httpx capture is already installed; run in a fresh process")
        self.original = [cls.__dict__[name] for cls, name in _PATCHED_ATTRS]
        with art.Trajectory():  # the public way in: enter_trajectory() installs the capture
            pass
        self.patched = [cls.__dict__[name] for cls, name in _PATCHED_ATTRS]
        if any(a is b for a, b in zip(self.original, self.patched, strict=True)):
            raise SystemExit("ART's capture did not patch httpx as expected")
        self.use(False)

    def use(self, patched: bool) -> None:
        for (cls, name), method in zip(
            _PATCHED_ATTRS, self.patched if patched else self.original, strict=True
        ):
            setattr(cls, name, method)


def configure(patch: ARTPatch, arm: str) -> None:
    art_patched, instrumented = ARM_SETUP[arm]
    patch.use(art_patched)
    if instrumented:
        at.instrument()
    else:
        at.uninstrument()


# -- checks ----------------------------------------------------------------------------------


@dataclass
class Checks:
    failures: list[str] = field(default_factory=list)
    passed: int = 0

    def expect(self, ok: bool, what: str) -> None:
        if ok:
            self.passed += 1
        elif len(self.failures) < 20:
            self.failures.append(what)


def check_arm(checks: Checks, label: str, arm: str, last: Any) -> None:
    """The last call of a block did what the arm claims (server answer, and capture)."""
    if arm == "arttrace":
        t: at.Trajectory = last
        calls = t.calls
        ok = len(calls) == 1
        if ok:
            call = calls[0]
            choice = call.choices[0] if call.choices else None
            ok = (
                call.trainable
                and choice is not None
                and call.completion_tokens == COMPLETION_TOKENS
                and (call.usage or {}).get("completion_tokens") == COMPLETION_TOKENS
                and call.untrainable_reason(choice) is None
            )
        checks.expect(ok, f"{label}: arttrace did not record one trainable 256-token call")
    elif arm == "ART capture":
        trajectory, tokens = last
        exchanges = trajectory.exchanges.chat_completions
        ok = tokens == COMPLETION_TOKENS and len(exchanges) == 1
        if ok:
            response = exchanges[0].response
            logprobs = response.choices[0].logprobs
            ok = (
                response.usage is not None
                and response.usage.completion_tokens == COMPLETION_TOKENS
                and logprobs is not None
                and len(logprobs.content or ()) == COMPLETION_TOKENS
            )
        checks.expect(ok, f"{label}: ART did not capture one 256-token exchange")
    else:
        checks.expect(last == COMPLETION_TOKENS, f"{label}/{arm}: usage.completion_tokens != 256")


# -- timing ----------------------------------------------------------------------------------

Block = Callable[[int], Awaitable[tuple[float, Any]]]


def sync_blocks(client: openai.OpenAI, stream: bool) -> dict[str, Block]:
    def call() -> int | None:
        return sync_call(client, stream)

    policy = at.trainable(name="policy")(call)

    def baseline(k: int) -> tuple[float, Any]:
        start = time.perf_counter()
        for _ in range(k):
            tokens = call()
        return (time.perf_counter() - start) / k, tokens

    def arttrace_arm(k: int) -> tuple[float, Any]:
        start = time.perf_counter()
        for i in range(k):
            with at.trajectory(i) as t:
                policy()
        return (time.perf_counter() - start) / k, t

    def art_arm(k: int) -> tuple[float, Any]:
        start = time.perf_counter()
        for _ in range(k):
            with art.Trajectory() as trajectory:
                tokens = call()
        return (time.perf_counter() - start) / k, (trajectory, tokens)

    def wrap(fn: Callable[[int], tuple[float, Any]]) -> Block:
        async def block(k: int) -> tuple[float, Any]:
            return fn(k)

        return block

    return {
        "baseline": wrap(baseline),
        "arttrace": wrap(arttrace_arm),
        "baseline+ART patch": wrap(baseline),
        "ART capture": wrap(art_arm),
    }


def async_blocks(client: openai.AsyncOpenAI, stream: bool) -> dict[str, Block]:
    async def call() -> int | None:
        return await async_call(client, stream)

    policy = at.trainable(name="policy")(call)

    async def baseline(k: int) -> tuple[float, Any]:
        start = time.perf_counter()
        for _ in range(k):
            tokens = await call()
        return (time.perf_counter() - start) / k, tokens

    async def arttrace_arm(k: int) -> tuple[float, Any]:
        start = time.perf_counter()
        for i in range(k):
            async with at.trajectory(i) as t:
                await policy()
        return (time.perf_counter() - start) / k, t

    async def art_arm(k: int) -> tuple[float, Any]:
        start = time.perf_counter()
        for _ in range(k):
            with art.Trajectory() as trajectory:
                tokens = await call()
        return (time.perf_counter() - start) / k, (trajectory, tokens)

    return {
        "baseline": baseline,
        "arttrace": arttrace_arm,
        "baseline+ART patch": baseline,
        "ART capture": art_arm,
    }


@dataclass
class ModeResult:
    label: str
    calls_per_block: int
    rounds: int
    seconds: dict[str, list[float]]  # per arm, one per-call mean per round

    def median(self, arm: str) -> float:
        return statistics.median(self.seconds[arm])

    def paired(self, arm: str, base: str, op: Callable[[float, float], float]) -> float:
        return statistics.median(
            op(a, b) for a, b in zip(self.seconds[arm], self.seconds[base], strict=True)
        )


def time_mode(
    loop: asyncio.AbstractEventLoop,
    patch: ARTPatch,
    llm: ScriptedLLM,
    checks: Checks,
    label: str,
    blocks: dict[str, Block],
    calls_per_block: int,
    rounds: int,
) -> ModeResult:
    # warm up every arm (imports, caches, the tokenizer's vocabulary), checking each
    for arm in ARMS:
        configure(patch, arm)
        _, last = loop.run_until_complete(blocks[arm](2))
        check_arm(checks, label, arm, last)
    seconds: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for r in range(rounds):
        order = ARMS[r % len(ARMS) :] + ARMS[: r % len(ARMS)]  # rotate to spread drift
        for arm in order:
            configure(patch, arm)
            llm.requests.clear()  # the scripted server logs every request body
            gc.collect()
            gc.disable()  # collections land on whichever arm happens to trigger them
            try:
                per_call, last = loop.run_until_complete(blocks[arm](calls_per_block))
            finally:
                gc.enable()
            seconds[arm].append(per_call)
            check_arm(checks, label, arm, last)
    configure(patch, "baseline")
    return ModeResult(label, calls_per_block, rounds, seconds)


# -- memory ----------------------------------------------------------------------------------


def _rss() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


@dataclass
class MemoryResult:
    label: str
    completions: int
    tokens: int
    traced_bytes: int
    rss_bytes: int | None
    seconds: float
    top_sites: list[str]

    @property
    def per_token(self) -> float:
        return self.traced_bytes / self.tokens if self.tokens else float("nan")

    @property
    def rss_per_token(self) -> float | None:
        return None if self.rss_bytes is None or not self.tokens else self.rss_bytes / self.tokens


def measure_memory(
    label: str,
    capture_one: Callable[[int], Any],
    count_tokens: Callable[[Any], int],
    llm: ScriptedLLM,
    n: int,
) -> MemoryResult:
    """Bytes still allocated, after gc, by ``n`` captured completions kept alive.

    ``capture_one(i)`` runs one call in its own trajectory and returns the trajectory (the SDK
    response is dropped when it returns). Measured with tracemalloc; the RSS growth over the
    same run, less tracemalloc's own bookkeeping, is shown alongside as a rough cross-check.
    """
    for i in range(5):  # warm-up, not kept
        capture_one(-1 - i)
    llm.requests.clear()
    gc.collect()
    rss_before = _rss()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    traced_before = tracemalloc.get_traced_memory()[0]
    overhead_before = tracemalloc.get_tracemalloc_memory()
    kept: list[Any] = []
    start = time.perf_counter()
    for i in range(n):
        kept.append(capture_one(i))
        llm.requests.clear()
    seconds = time.perf_counter() - start
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] - traced_before
    overhead = tracemalloc.get_tracemalloc_memory() - overhead_before
    rss_after = _rss()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    sites = [
        f"{s.size_diff / n:8.0f} B/call  {s.traceback[0].filename.rsplit('site-packages/', 1)[-1]}"
        f":{s.traceback[0].lineno}"
        for s in after.compare_to(before, "lineno")[:6]
    ]
    del before, after
    rss = None if rss_before is None or rss_after is None else rss_after - rss_before - overhead
    tokens = sum(count_tokens(k) for k in kept)
    return MemoryResult(label, n, tokens, traced, rss, seconds, sites)


def _deep_size(obj: Any, seen: set[int]) -> int:
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(_deep_size(k, seen) + _deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, list | tuple | set | frozenset):
        size += sum(_deep_size(x, seen) for x in obj)
    elif not isinstance(obj, str | bytes | int | float | bool | type(None)):
        for name in getattr(type(obj), "__slots__", ()):
            if hasattr(obj, name):
                size += _deep_size(getattr(obj, name), seen)
        if hasattr(obj, "__dict__"):
            size += _deep_size(vars(obj), seen)
    return size


def record_breakdown(t: at.Trajectory) -> list[tuple[str, int]]:
    """Where the bytes of one captured call go (deep getsizeof; shared objects counted once)."""
    call = t._calls[0]
    choice = call.choices[0]
    seen: set[int] = set()
    parts = [
        ("assistant message (content text)", choice.message),
        ("logprobs array('d')", choice.logprobs),
        ("token_ids array('q')", choice.token_ids),
        ("ChoiceRecord rest", choice),
        ("request messages", call.messages),
        ("request params", call.params),
        ("prompt_token_ids", call.prompt_token_ids),
        ("usage", call.usage),
        ("LLMCall rest (ids, model, times)", call),
        ("Trajectory object", t),
    ]
    return [(name, _deep_size(obj, seen)) for name, obj in parts]


# -- report ----------------------------------------------------------------------------------


def mark(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def us(seconds: float) -> str:
    return f"{seconds * 1e6:9.1f}"


def report_timing(results: list[ModeResult]) -> None:
    print("\nPer-call wall time, µs (median over rounds of each block's mean per call)")
    header = f"  {'mode':<20}{'calls x rounds':>15}" + "".join(f"{a:>20}" for a in ARMS)
    print(header)
    for res in results:
        row = f"  {res.label:<20}{f'{res.calls_per_block} x {res.rounds}':>15}"
        row += "".join(f"{us(res.median(a)):>20}" for a in ARMS)
        print(row)

    print(f"\n(a) instrumented / uninstrumented wall time (median of per-round ratios),"
          f" target <= {TARGET_RATIO:.2f}")
    for res in results:
        ratio = res.paired("arttrace", "baseline", lambda a, b: a / b)
        extra = res.paired("arttrace", "baseline", lambda a, b: a - b)
        print(f"  {res.label:<20}{ratio:8.3f}   (+{extra * 1e6:.1f} µs/call, "
              f"{extra * 1e9 / COMPLETION_TOKENS:.0f} ns/token)   {mark(ratio <= TARGET_RATIO)}")

    print(f"\n(b) capture overhead per call, µs: arttrace vs ART (median of per-round"
          f" differences), target ratio < {TARGET_ART_RATIO:.1f}")
    print(f"  {'mode':<20}{'arttrace':>10}{'ART':>10}{'ratio':>8}{'ART patch idle':>16}")
    for res in results:
        ours = res.paired("arttrace", "baseline", lambda a, b: a - b)
        theirs = res.paired("ART capture", "baseline+ART patch", lambda a, b: a - b)
        idle = res.paired("baseline+ART patch", "baseline", lambda a, b: a - b)
        ratio = ours / theirs if theirs > 0 else float("nan")
        ok = theirs > 0 and ratio < TARGET_ART_RATIO
        print(f"  {res.label:<20}{ours * 1e6:10.1f}{theirs * 1e6:10.1f}{ratio:8.3f}"
              f"{idle * 1e6:16.1f}   {mark(ok)}")
    print("  arttrace = arttrace arm - baseline (both on the original httpx);\n"
          "  ART      = ART capture arm - baseline+ART patch (both on ART-patched httpx, scope\n"
          "             inactive vs active); 'ART patch idle' = what the installed-but-idle\n"
          "             patch costs every call, not counted in ART's overhead.")


def report_memory(results: list[MemoryResult], breakdown: list[tuple[str, int]]) -> None:
    print(f"\n(c) memory retained by captured completions, target <= {TARGET_BYTES_PER_TOKEN:.0f}"
          " bytes per completion token")
    print("    (tracemalloc: bytes still allocated after gc, SDK responses dropped; the request\n"
          "     messages are retained too: the prompt here is one short user message)")
    for m in results:
        rss = m.rss_per_token
        rss_text = "n/a" if rss is None else f"{rss:.1f}"
        line = (f"  {m.label:<36}{m.completions:>6} calls {m.tokens:>8} tokens  "
                f"{m.per_token:7.1f} B/token  ({m.traced_bytes / m.completions:7.0f} B/call;"
                f" RSS ~{rss_text} B/token)")
        if m.label.startswith("arttrace"):
            line += f"   {mark(m.per_token <= TARGET_BYTES_PER_TOKEN)}"
        print(line)
    for m in results:
        print(f"  top allocation sites still alive, {m.label}:")
        for site in m.top_sites:
            print(f"    {site}")
    if breakdown:
        total = sum(b for _, b in breakdown)
        print("  one arttrace call record, deep getsizeof (no allocator overhead):")
        for name, size in breakdown:
            print(f"    {name:<36}{size:7d} B  {size / COMPLETION_TOKENS:6.1f} B/token")
        print(f"    {'total':<36}{total:7d} B  {total / COMPLETION_TOKENS:6.1f} B/token")


# -- main ------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (~20 s)")
    parser.add_argument("--no-async", action="store_true", help="skip the AsyncOpenAI modes")
    args = parser.parse_args()
    quick = args.quick
    rounds = 5 if quick else 13
    per_block = {False: 12 if quick else 30, True: 2 if quick else 4}  # by stream
    mem_calls = 300 if quick else 2000
    mem_stream_calls = 20 if quick else 60
    mem_art_calls = 40 if quick else 150

    check_content_tokens()
    started = time.perf_counter()
    print(f"arttrace capture benchmark{' (quick)' if quick else ''}: {COMPLETION_TOKENS}-token "
          "completions with logprobs and token ids, in-process ScriptedLLM transport")
    print(f"  python {platform.python_version()}, openai {openai.__version__}, "
          f"openpipe-art {getattr(art, '__version__', '?')}, arttrace {at.__version__}, "
          f"{os.cpu_count()} CPUs; OpenTelemetry: no SDK configured (arttrace's spans are"
          " no-ops)")
    print("  both arms request logprobs=True and extra_body={'return_token_ids': True};\n"
          "  arttrace arm: each call in its own `with at.trajectory(i)` and `@at.trainable`\n"
          "  function (their cost is counted); baseline: the bare call, arttrace"
          " uninstrumented;\n  ART arm: each call in its own `with art.Trajectory()`."
          " gc is paused inside timed blocks.")

    llm = ScriptedLLM(replies=lambda body: Reply(content=CONTENT))
    sync_client = openai.OpenAI(
        api_key="unused",
        base_url="http://scripted.test/v1",
        http_client=httpx.Client(transport=llm.transport()),
        max_retries=0,
    )
    async_client = openai.AsyncOpenAI(
        api_key="unused",
        base_url="http://scripted.test/v1",
        http_client=httpx.AsyncClient(transport=llm.transport()),
        max_retries=0,
    )
    patch = ARTPatch()
    checks = Checks()
    loop = asyncio.new_event_loop()

    modes: list[tuple[str, dict[str, Block], int]] = [
        ("sync", sync_blocks(sync_client, False), per_block[False]),
        ("sync stream", sync_blocks(sync_client, True), per_block[True]),
    ]
    if not args.no_async:
        modes += [
            ("async", async_blocks(async_client, False), per_block[False]),
            ("async stream", async_blocks(async_client, True), per_block[True]),
        ]
    timing: list[ModeResult] = []
    for label, blocks, k in modes:
        print(f"  timing {label} ...", flush=True)
        timing.append(time_mode(loop, patch, llm, checks, label, blocks, k, rounds))

    # memory: arttrace (whole and streamed responses), and ART's capture for reference
    print("  measuring memory ...", flush=True)
    policy_sync = at.trainable(name="policy")(lambda stream: sync_call(sync_client, stream))

    def arttrace_one(stream: bool) -> Callable[[int], Any]:
        def one(i: int) -> at.Trajectory:
            with at.trajectory(f"example-{i}") as t:
                policy_sync(stream)
            return t

        return one

    def art_one(i: int) -> art.Trajectory:
        with art.Trajectory() as trajectory:
            sync_call(sync_client, False)
        return trajectory

    def arttrace_tokens(t: at.Trajectory) -> int:
        return sum(c.completion_tokens for c in t.calls)

    def art_tokens(trajectory: art.Trajectory) -> int:
        return sum(
            len(choice.logprobs.content or ())
            for exchange in trajectory.exchanges.chat_completions
            for choice in exchange.response.choices
            if choice.logprobs is not None
        )

    memory: list[MemoryResult] = []
    configure(patch, "arttrace")
    memory.append(measure_memory("arttrace, whole responses", arttrace_one(False),
                                 arttrace_tokens, llm, mem_calls))
    memory.append(measure_memory("arttrace, streamed responses", arttrace_one(True),
                                 arttrace_tokens, llm, mem_stream_calls))
    breakdown = record_breakdown(arttrace_one(False)(0))
    configure(patch, "ART capture")
    memory.append(measure_memory("ART capture (reference), whole", art_one, art_tokens, llm,
                                 mem_art_calls))
    configure(patch, "baseline")
    for m in memory:
        want = m.completions * COMPLETION_TOKENS
        checks.expect(m.tokens == want, f"memory {m.label}: {m.tokens} tokens captured, not {want}")

    report_timing(timing)
    report_memory(memory, breakdown)
    print(f"\nsanity checks: {checks.passed} passed, {len(checks.failures)} failed"
          + "".join(f"\n  FAILED: {f}" for f in checks.failures))
    print(f"total time {time.perf_counter() - started:.0f} s")
    loop.close()


if __name__ == "__main__":
    main()
    sys.exit(0)
