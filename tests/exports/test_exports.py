"""Exports (``arttrace export``): each read back by the libraries that consume it and held equal
to the journal it came from.

One run folder is written as the Trainer writes it (``Journal.record``), of runs captured over
HTTP from the scripted vLLM-like server: a tool-calling policy (two trainable turns), a
sub-agent (its own history), a judge outside every ``@trainable`` function (context only), a
run that raised, a run whose server sent no logprobs, a validation run, and a credential in a
prompt, a reply and an exception. SFT data is read back by ART's own JSONL reader (and
tokenised by ART's SFT tokenizer with Qwen2.5's chat template) and by ``datasets``; the Parquet
table by pyarrow and ``datasets``, its tokens against ART's own sequence assembly; the OTLP spans
by a real OTLP/HTTP receiver, against the live spans the same calls made.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import warnings
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pyarrow.parquet as pq
import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import arttrace as at
from arttrace._asgi_server import ServerThread
from arttrace._journal import Journal
from arttrace.app._args import HelpFormatter
from arttrace.app.export_command import add_export_command
from arttrace.capture import _warnings
from arttrace.exports import ExportError, export_otlp, export_parquet, export_sft
from arttrace.testing import Reply, ScriptedLLM, ToolCall, serve
from support.common import TOOLS

SECRET = "sk-exports-0123456789abcdefXYZ"
Slot = tuple[int, int, int]  # step, position, rollout
REWARDS = {  # (step, position) -> reward of each rollout; ties keep the first
    (0, 0): [0.0, 1.0, 1.0],
    (0, 1): [0.5, 0.2, 9.0],  # rollout 2 raises: never exported, however high its reward
    (1, 0): [0.3, 0.7, 0.1],  # rollout 0 has the credential in its prompt and reply
    (1, 1): [0.4, 0.4, 5.0],  # rollout 2: no logprobs from its server, nothing to train
}
RAISES, SECRET_RUN, NO_LOGPROBS, VAL = (0, 1, 2), (1, 0, 0), (1, 1, 2), (1, 2, 0)


def reply(request: dict[str, Any]) -> Reply:
    last = request["messages"][-1]
    text = str(last.get("content") or "")
    if last["role"] == "tool":
        leak = f" Your key {SECRET} is safe." if SECRET in json.dumps(request["messages"]) else ""
        return Reply("2 + 3 = 5." + leak)
    if text.startswith("Check:"):
        return Reply("Looks right.")
    if text == "Grade it.":
        return Reply("8/10")
    return Reply("Let me add.", tool_calls=[ToolCall("add", {"a": 2, "b": 3})])


@at.trainable(name="solver")
def solver(client: openai.OpenAI, question: str) -> None:
    messages: list[Any] = [
        {"role": "system", "content": "Use the tool."},
        {"role": "user", "content": question},
    ]
    first = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    messages += [
        first.choices[0].message,
        {"role": "tool", "tool_call_id": call.id, "content": "5"},
    ]
    client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)


@at.trainable(name="checker")
def checker(client: openai.OpenAI) -> None:
    """A sub-agent: a conversation of its own, an additional history."""
    client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "Check: 5"}]
    )


def judge(client: openai.OpenAI) -> None:
    """Outside every @trainable function: a context-only conversation."""
    client.chat.completions.create(
        model="judge", messages=[{"role": "user", "content": "Grade it."}]
    )


class Captured:
    def __init__(
        self, folder: Path, runs: dict[Slot, at.Trajectory], live: dict[Slot, list[ReadableSpan]]
    ):
        self.folder, self.runs, self.live = folder, runs, live
        """The run folder, its runs as the journal holds them, the live spans each run made."""


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Captured]:
    """A run folder as the Trainer writes it, and the live spans its calls made."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    live = InMemorySpanExporter()
    processor = SimpleSpanProcessor(live)
    provider.add_span_processor(processor)
    servers = [serve(ScriptedLLM(reply)), serve(ScriptedLLM(reply, logprobs=False))]
    clients = [openai.OpenAI(base_url=s.base_url, api_key="test", max_retries=0) for s in servers]
    folder = tmp_path_factory.mktemp("run")
    journal = Journal(folder)
    slots = [(s, p, r) for (s, p), rewards in REWARDS.items() for r in range(len(rewards))]
    made: dict[Slot, list[ReadableSpan]] = {}
    at.instrument()
    try:
        for step, position, rollout in [*slots, VAL]:
            if position == 0 and rollout == 0:
                journal.finished(step)  # the Trainer makes the step's folder first
            slot = (step, position, rollout)
            split = "val" if slot == VAL else "train"
            meta = {"split": split, "step": step, "rollout": rollout, "policy_step": step}
            client = clients[slot == NO_LOGPROBS]
            question = f"What is 2 + 3? My key is {SECRET}" if slot == SECRET_RUN else "2 + 3?"
            t = at.trajectory(f"q-{position}", metadata=meta)
            raises = pytest.raises(RuntimeError) if slot == RAISES else contextlib.nullcontext()
            with warnings.catch_warnings(record=True) as caught, raises, t:
                warnings.simplefilter("always")
                solver(client, question)
                checker(client)
                judge(client)
                t.reward = 3.0 if slot == VAL else REWARDS[(step, position)][rollout]
                if slot == RAISES:
                    raise RuntimeError(f"upstream said: invalid key {SECRET}")
            expected = [at.UntrainableTurnWarning]  # once per run, model and cause
            assert [w.category for w in caught] == (expected if slot == NO_LOGPROBS else [])
            journal.record(step, (position, rollout), t)
            made[slot] = list(live.get_finished_spans())
            live.clear()
        journal.close()
    finally:
        at.uninstrument()
        _warnings.reset()
        for client in clients:
            client.close()
        for s in servers:
            s.stop()
    runs = {
        (step, position, rollout): t
        for step in (0, 1)
        for (position, rollout), t in Journal(folder).finished(step).items()
    }
    yield Captured(folder, runs, made)
    processor.shutdown()


def best_per_group(runs: dict[Slot, at.Trajectory]) -> list[Slot]:
    """What --best-per-group keeps, worked out here: per (step, position) of the training
    runs that did not raise, the highest reward, the lowest rollout on a tie."""
    best: dict[tuple[int, int], Slot] = {}
    for slot in sorted(runs):
        t = runs[slot]
        if t.metadata["split"] != "train" or t.exception is not None:
            continue
        key = slot[:2]
        if key not in best or t.reward > runs[best[key]].reward:  # type: ignore[operator]
            best[key] = slot
    return sorted(best.values())


def without_nulls(value: Any) -> Any:
    """``value`` without the keys whose value is null (absent and null mean the same in the
    OpenAI format; ``datasets`` fills a row's missing keys with null)."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def art_lines(t: at.Trajectory) -> list[dict[str, Any]]:
    """The SFT lines of a run, from ART's own objects: the ``messages()`` of each history of
    ``to_art()`` but the judge's (every conversation here ends with its policy turn)."""
    from art.trajectories import LegacyHistory

    a = t.to_art()
    main = LegacyHistory(messages_and_choices=a.messages_and_choices, tools=a.tools)
    lines = []
    for history in [main, *a.additional_histories]:
        messages = without_nulls(history.messages())
        if messages[0]["content"] == "Grade it.":
            continue
        line = {"messages": messages}
        if history.tools is not None:
            line["tools"] = history.tools
        lines.append(line)
    return lines


def redacted(value: Any) -> Any:
    return json.loads(json.dumps(value).replace(SECRET, "[redacted]"))


# -- SFT -------------------------------------------------------------------------------------


def test_sft_best_per_group_reads_back_in_art_and_datasets(
    captured: Captured, tmp_path: Path
) -> None:
    from art.preprocessing.tokenize import tokenize_sft_batch
    from art.utils.model_config import get_instruction_response_parts
    from art.utils.sft import iterate_file
    from datasets import load_dataset

    from support.qwen import qwen_tokenizer

    out = tmp_path / "sft.jsonl"
    summary = export_sft([captured.folder], out, best_per_group=True)
    chosen = best_per_group(captured.runs)
    assert RAISES not in chosen and VAL not in chosen
    assert (0, 0, 1) in chosen  # the tie: the first of the equal rewards
    assert NO_LOGPROBS in chosen  # SFT learns the text: no logprobs needed
    expected = [redacted(line) for slot in chosen for line in art_lines(captured.runs[slot])]
    assert len(expected) == 2 * len(chosen)  # the solver's and the checker's; not the judge's
    assert expected[0]["messages"][2]["tool_calls"][0]["function"]["arguments"] == (
        '{"a": 2, "b": 3}'
    )
    assert [m["role"] for m in expected[0]["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert (
        expected[0]["messages"][3]["tool_call_id"]
        == (expected[0]["messages"][2]["tool_calls"][0]["id"])
    )
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines == expected
    assert (summary.rows, summary.runs) == (len(expected), len(chosen))
    assert summary.skipped == {
        "raised an exception": 1,
        "in another split": 1,
        "not the best run of their group": 12 - 1 - len(chosen),
    }
    assert out.stat().st_mode & 0o777 == 0o600  # it holds prompts, as the journal does

    read = list(iterate_file(str(out), shuffle_buffer_size=1))  # ART's reader, in file order
    assert [(r.messages_and_choices, r.tools) for r in read] == [
        (line["messages"], line.get("tools")) for line in expected
    ]
    tokenizer = qwen_tokenizer()  # Qwen2.5-Instruct's, offline
    instruction, response = get_instruction_response_parts("Qwen/Qwen2.5-0.5B-Instruct", tokenizer)
    batch = tokenize_sft_batch(read, 1e-5, tokenizer, instruction, response)
    assert batch.num_trajectories == len(read) and batch.num_dropped_trajectories == 0
    for tensors, line in zip(batch.trajectory_tensors, expected, strict=True):
        labels = tensors["labels"][0]
        trained = tokenizer.decode(labels[labels != -100])
        assert line["messages"][-1]["content"] in trained  # the policy's last turn is learned
        for message in line["messages"]:  # and its tool calls, as the chat template renders them
            for call in message.get("tool_calls", []):
                assert f'"name": "{call["function"]["name"]}"' in trained

    dataset = load_dataset("json", data_files=str(out), split="train", cache_dir=str(tmp_path))
    assert [without_nulls(row) for row in dataset] == expected


def test_sft_min_reward_takes_every_run_that_reaches_it(captured: Captured, tmp_path: Path) -> None:
    out = tmp_path / "sft.jsonl"
    summary = export_sft([captured.folder], out, min_reward=0.5, split="all")
    chosen = [
        slot
        for slot, t in sorted(captured.runs.items())
        if t.exception is None and t.reward is not None and t.reward >= 0.5
    ]
    assert VAL in chosen  # split="all"
    expected = [redacted(line) for slot in chosen for line in art_lines(captured.runs[slot])]
    assert [json.loads(line) for line in out.read_text().splitlines()] == expected
    assert summary.skipped["below --min-reward"] == 6
    assert summary.skipped["raised an exception"] == 1


# -- Parquet ---------------------------------------------------------------------------------


def art_sequences(t: at.Trajectory) -> Any:
    """ART's own token sequences for the run: what its trainer assembles from to_art()."""
    from art.preprocessing.tokenize import assemble_vllm_training_sequences
    from art.trajectories import LegacyHistory

    a = t.to_art()
    return assemble_vllm_training_sequences(
        tokenizer=None,  # type: ignore[arg-type]  # only decoding tokens for display uses it
        histories=[
            LegacyHistory(messages_and_choices=a.messages_and_choices, tools=a.tools),
            *a.additional_histories,
        ],
        advantage=0.0,
        allow_training_without_logprobs=False,
        trajectory=a,
    )


def test_parquet_rows_equal_the_journal_and_arts_token_sequences(
    captured: Captured, tmp_path: Path
) -> None:
    from datasets import Dataset

    out = tmp_path / "runs.parquet"
    summary = export_parquet([captured.folder], out, row_group_size=5)
    slots = sorted(captured.runs)
    assert summary.rows == summary.runs == len(slots) and not summary.skipped
    assert pq.ParquetFile(out).metadata.num_row_groups == math.ceil(len(slots) / 5)
    table = pq.read_table(out)
    rows = table.to_pylist()
    assert [(r["step"], r["position"], r["rollout"]) for r in rows] == slots
    dataset = Dataset.from_parquet(str(out), cache_dir=str(tmp_path / "hf"))
    assert len(dataset) == len(rows)
    for row, from_datasets in zip(rows, dataset, strict=True):
        assert json.dumps(from_datasets, sort_keys=True) == json.dumps(row, sort_keys=True)

    for row in rows:
        slot = (row["step"], row["position"], row["rollout"])
        t = captured.runs[slot]
        assert row["run_dir"] == str(captured.folder) and row["example_id"] == t.example_id
        assert row["reward"] == t.reward and row["split"] == t.metadata["split"]
        assert row["policy_step"] == t.metadata["policy_step"]
        assert (row["started_at"], row["ended_at"]) == (t.started_at, t.ended_at)
        assert row["calls"] == len(t.calls) == 4
        if slot == RAISES:
            assert row["exception_type"] == "RuntimeError"
            assert row["exception_message"] == "upstream said: invalid key [redacted]"
        else:
            assert row["exception_type"] is row["exception_message"] is None
        ids, logprobs, mask = row["token_ids"], row["logprobs"], row["mask"]
        sequences = art_sequences(t)
        assert row["sequence_lengths"] == [len(s.token_ids) for s in sequences]
        assert ids == [i for s in sequences for i in s.token_ids]
        assert mask == [bool(m) for s in sequences for m in s.assistant_mask]
        expected_logprobs = np.array([x for s in sequences for x in s.logprobs])
        assert np.array_equal(np.array(logprobs), expected_logprobs, equal_nan=True)
        assert np.isnan(np.array(logprobs)[~np.array(mask, dtype=bool)]).all()
        turns = row["turns"]
        assert [turn["history"] for turn in turns] == [0, 0, 1, 2]
        assert [turn["model"] for turn in turns] == ["policy", "policy", "policy", "judge"]
        assert turns[3]["untrainable_reason"].startswith("not a policy turn")
        trainable = [turn for turn in turns if turn["trainable"]]
        assert row["trainable_turns"] == len(trainable)
        assert (
            row["trainable_tokens"]
            == sum(mask)
            == sum(turn["sampled_tokens"] for turn in trainable)
        )
        starts = np.cumsum([0, *row["sequence_lengths"]])  # where each sequence starts
        policy = [c for c in t.calls if c.trainable and c.choices[0].logprobs is not None]
        for turn, call in zip(trainable, policy, strict=True):  # exact, as float64
            record, n, start = call.choices[0], turn["sampled_tokens"], turn["offset"]
            assert ids[start : start + n] == record.token_ids.tolist()
            assert array("d", logprobs[start : start + n]) == record.logprobs
            assert all(mask[start : start + n])
            begins = int(starts[starts <= start].max())  # the turn's prompt: back to there
            assert ids[begins:start] == call.prompt_token_ids.tolist()  # type: ignore[union-attr]
            assert turn["prompt_tokens"] == start - begins
        if slot == NO_LOGPROBS:
            assert ids == [] and row["sequence_lengths"] == []
            assert [turn["untrainable_reason"] for turn in turns[:3]] == ["no logprobs"] * 3
        else:
            assert len(trainable) == 3 and len(row["sequence_lengths"]) == 2  # solver, checker
        main = t.to_art()
        assert json.loads(row["messages"]) == redacted(without_nulls(main.messages()))
        assert json.loads(row["tools"]) == main.tools
        others = json.loads(row["additional_histories"])
        assert [h["messages"] for h in others] == [
            redacted(without_nulls(h.messages())) for h in main.additional_histories
        ]


# -- OTLP ------------------------------------------------------------------------------------


class Receiver:
    """An OTLP/HTTP collector: decodes each ``ExportTraceServiceRequest`` it is sent."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.bodies: list[bytes] = []
        self.headers: list[dict[str, str]] = []

        async def traces(request: Request) -> Response:
            self.bodies.append(await request.body())
            self.headers.append(dict(request.headers))
            if self.status != 200:
                return Response(b"denied", status_code=self.status)
            response = ExportTraceServiceResponse().SerializeToString()
            return Response(response, media_type="application/x-protobuf")

        app = Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])])
        self.server = ServerThread(app, "127.0.0.1", 0, name="OTLP receiver")
        self.server.start()
        self.url = f"http://127.0.0.1:{self.server.address[1]}"

    def spans(self) -> list[dict[str, Any]]:
        out = []
        for body in self.bodies:
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            for resource in request.resource_spans:
                service = {a.key: _value(a.value) for a in resource.resource.attributes}
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        out.append(
                            {
                                "service": service["service.name"],
                                "scope": scope.scope.name,
                                "trace": span.trace_id.hex(),
                                "id": span.span_id.hex(),
                                "parent": span.parent_span_id.hex(),
                                "name": span.name,
                                "kind": span.kind,
                                "start": span.start_time_unix_nano,
                                "end": span.end_time_unix_nano,
                                "attributes": {a.key: _value(a.value) for a in span.attributes},
                                "status": (span.status.code, span.status.message),
                                "events": [
                                    (e.name, {a.key: _value(a.value) for a in e.attributes})
                                    for e in span.events
                                ],
                            }
                        )
        return out


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.stop()


def test_otlp_spans_equal_the_runs_calls_and_the_live_spans(
    captured: Captured, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    headers = {"Authorization": f"Bearer {SECRET}", "x-team": "evaluation"}
    summary = export_otlp([captured.folder], receiver.url, headers, batch_size=7)
    calls = sum(len(t.calls) for t in captured.runs.values())
    assert summary.rows == calls + len(captured.runs) and summary.runs == len(captured.runs)
    assert summary.destination == f"{receiver.url}/v1/traces"
    assert len(receiver.bodies) > 1  # batched
    assert all(h["authorization"] == f"Bearer {SECRET}" for h in receiver.headers)
    assert all(h["content-type"] == "application/x-protobuf" for h in receiver.headers)
    assert all(h["x-team"] == "evaluation" for h in receiver.headers)
    spans = receiver.spans()
    assert len(spans) == summary.rows
    assert {(s["service"], s["scope"]) for s in spans} == {("arttrace", "arttrace")}
    roots = [s for s in spans if s["parent"] == ""]
    assert len(roots) == len(captured.runs) and len({s["trace"] for s in roots}) == len(roots)
    for root in roots:
        attributes = root["attributes"]
        slot = (
            attributes["arttrace.step"],
            attributes["arttrace.position"],
            attributes["arttrace.rollout"],
        )
        t = captured.runs[slot]
        assert root["name"] == f"trajectory {t.example_id}"
        assert abs(root["start"] / 1e9 - t.started_at) < 1e-6  # type: ignore[operator]
        assert abs(root["end"] / 1e9 - t.ended_at) < 1e-6  # type: ignore[operator]
        assert attributes == {
            "arttrace.example_id": t.example_id,
            "arttrace.reward": t.reward,
            "arttrace.step": slot[0],
            "arttrace.position": slot[1],
            "arttrace.rollout": slot[2],
            "arttrace.split": t.metadata["split"],
            "arttrace.policy_step": t.metadata["policy_step"],
        }
        live = captured.live[slot]  # what the live run sent (its root span ends last)
        assert live[-1].name == root["name"]
        assert dict(live[-1].attributes).items() <= attributes.items()
        live_calls = [s for s in live if s.name.startswith("chat ")]
        children = sorted((s for s in spans if s["parent"] == root["id"]), key=lambda s: s["start"])
        assert all(s["trace"] == root["trace"] for s in children)
        assert [s["name"] for s in children] == [f"chat {c.model}" for c in t.calls]
        for span, call, made in zip(children, t.calls, live_calls, strict=True):
            assert span["kind"] == 3  # SPAN_KIND_CLIENT
            assert abs(span["start"] / 1e9 - call.started_at) < 1e-6
            assert abs(span["end"] / 1e9 - call.ended_at) < 1e-6  # type: ignore[operator]
            assert span["attributes"]["gen_ai.operation.name"] == "chat"
            assert span["attributes"]["gen_ai.request.model"] == call.model
            assert (
                span["attributes"]["gen_ai.usage.output_tokens"] == call.usage["completion_tokens"]
            )  # type: ignore[index]
            assert span["attributes"]["arttrace.trainable"] is call.trainable
            expected = {
                k: list(v) if isinstance(v, tuple) else v
                for k, v in made.attributes.items()
                if not k.startswith("server.")  # the client's URL: not in the journal
            }
            assert span["attributes"] == expected
        if slot == RAISES:
            assert root["status"] == (2, "RuntimeError")  # STATUS_CODE_ERROR
            ((name, event),) = root["events"]
            assert name == "exception" and event["exception.type"] == "RuntimeError"
            assert event["exception.message"] == "upstream said: invalid key [redacted]"
        else:
            assert root["events"] == [] and root["status"][0] == 0
    for body in receiver.bodies:
        assert SECRET.encode() not in body

    ids, sent = {(s["trace"], s["id"]) for s in spans}, len(receiver.bodies)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)  # the standard defaults
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-team=replay")
    export_otlp([captured.folder])  # again: the same trace and span ids
    assert {(s["trace"], s["id"]) for s in receiver.spans()} == ids
    assert {h["x-team"] for h in receiver.headers[sent:]} == {"replay"}


def test_otlp_refused_batch_is_an_error_without_the_headers(
    captured: Captured, caplog: pytest.LogCaptureFixture
) -> None:
    refusing = Receiver(status=401)
    try:
        with caplog.at_level(logging.WARNING), pytest.raises(ExportError) as raised:
            export_otlp([captured.folder], refusing.url, {"x-api-key": "collector-key-4242424242"})
    finally:
        refusing.server.stop()
    message = str(raised.value)
    assert f"the OTLP endpoint {refusing.url}/v1/traces did not take a batch" in message
    assert "401" in message and "0 spans of 0 runs were sent before it" in message
    assert "collector-key-4242424242" not in message + caplog.text
    assert len(refusing.bodies) == 1  # a 401 is not retried


# -- the command -----------------------------------------------------------------------------


def command(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="arttrace", formatter_class=HelpFormatter)
    commands = parser.add_subparsers(dest="command")
    add_export_command(commands)
    args = parser.parse_args(["export", *argv])
    return int(args.run(args, commands.choices["export"]))


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--format", "sft"], "--format sft needs --out, e.g. --out data.jsonl"),
        (["--format", "sft", "--out", "{tmp}/data.json"], "--out must end in .jsonl"),
        (["--format", "parquet", "--out", "{tmp}"], "is a folder: give a file name"),
        (["--format", "otlp", "--out", "{tmp}/x.jsonl"], "--out is for --format sft and parquet"),
        (["--format", "otlp"], "no OTLP endpoint: give --endpoint URL"),
        (["--format", "otlp", "--endpoint", "ftp://x"], "must be an http:// or https:// URL"),
        (
            ["--format", "sft", "--out", "{tmp}/d.jsonl", "--endpoint", "http://x"],
            "--endpoint and --header are for --format otlp, not sft",
        ),
        (["--format", "otlp", "--header", "Authorization"], "--header: takes NAME=VALUE"),
        (["--format", "sft", "--out", "{tmp}/d.jsonl", "--min-reward", "inf"], "finite number"),
    ],
)
def test_command_refuses_bad_arguments_in_one_line(
    captured: Captured,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    error: str,
) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    with pytest.raises(SystemExit) as exited:
        command(str(captured.folder), *[a.format(tmp=tmp_path) for a in argv])
    assert exited.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("arttrace export: error: ") and error in last


def test_command_refuses_a_folder_without_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        command(str(tmp_path), "--format", "sft", "--out", str(tmp_path / "d.jsonl"))
    assert exited.value.code == 2
    assert f"{tmp_path} is not a run folder: " in capsys.readouterr().err
    assert not (tmp_path / "d.jsonl").exists()


def test_command_writes_and_says_what_it_skipped(
    captured: Captured, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sft.jsonl"
    assert command(str(captured.folder), "--format", "sft", "--out", str(out)) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"arttrace export: wrote 22 conversations from 11 runs to {out}, ")
    assert line.endswith("; skipped 1 in another split, 1 raised an exception")


def test_exports_never_hold_the_credential(captured: Captured, tmp_path: Path) -> None:
    """The credential was in a prompt, a reply and an exception message; it is in no export
    (the journal keeps the prompt and reply as the policy saw them)."""
    journal = b"".join(p.read_bytes() for p in captured.folder.rglob("rollouts.jsonl"))
    assert SECRET.encode() in journal
    sft, table = tmp_path / "all.jsonl", tmp_path / "all.parquet"
    export_sft([captured.folder], sft, split="all")
    export_parquet([captured.folder], table)
    assert SECRET not in sft.read_text() and "[redacted]" in sft.read_text()
    text = json.dumps(pq.read_table(table).to_pylist(), default=str)
    assert SECRET not in text and text.count("[redacted]") >= 3  # prompt, reply, exception


def test_a_line_being_written_is_left_alone(captured: Captured, tmp_path: Path) -> None:
    """Reading never writes: a last line without its newline (a run being appended, or torn)
    is not exported, and not cut off the file either."""
    folder = tmp_path / "live"
    step = folder / "journal" / "step-00000"
    step.mkdir(parents=True)
    whole = (captured.folder / "journal" / "step-00000" / "rollouts.jsonl").read_bytes()
    first = whole.split(b"\n")[0] + b"\n"
    (step / "rollouts.jsonl").write_bytes(first + first[: len(first) // 2])
    summary = export_parquet([folder], tmp_path / "live.parquet")
    assert summary.rows == 1
    assert (step / "rollouts.jsonl").read_bytes() == first + first[: len(first) // 2]
