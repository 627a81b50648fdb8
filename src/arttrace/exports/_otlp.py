"""OTel GenAI spans of recorded runs, replayed to an OTLP/HTTP endpoint (protobuf).

Each run becomes a trace: a root span ``trajectory <example_id>`` (its start and end, and
``arttrace.example_id``, ``arttrace.reward``, ``arttrace.step``, ``arttrace.position``,
``arttrace.rollout``, ``arttrace.split``, ``arttrace.policy_step``; a run that raised has an
``exception`` event and an error status) and, as its children, one ``chat <model>`` span per
LLM call with the call's own start and end times and the ``gen_ai.*`` attributes arttrace's
live spans carry (the same functions build them, in ``arttrace.capture._calls``); a failed
call has an error status. The journal keeps no ``@trainable`` or framework spans, so the calls
hang off the root directly. Trace and span ids are derived from the run (its folder, its line
and its start), so exporting a run again sends the same ids.

Spans are sent in batches of ``batch_size`` by the OTLP/HTTP exporter (its retries and timeout,
``OTEL_EXPORTER_OTLP_TIMEOUT``), one at a time: a batch the endpoint refuses stops the export
with an :class:`ExportError` saying so (a batch processor would drop it with a log line).
Header values are never printed; the exporter's log lines pass through arttrace's redaction.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import random
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

from .._errors import ConfigurationError
from ..capture._calls import _request_attributes, _response_attributes
from ..capture._redact import redact, remember, remember_query
from ..capture._trajectory import Trajectory
from ._source import Run, Selection, Split, selected
from ._summary import ExportError, ExportSummary

TRACES_PATH = "/v1/traces"
_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http._common",
    "urllib3.connectionpool",
)
"""The loggers the exporter's errors and retries reach (a filter sees only its own logger's
records, not those of its children)."""


def endpoint_url(endpoint: str | None) -> str:
    """The URL spans are posted to: ``endpoint`` (default ``OTEL_EXPORTER_OTLP_ENDPOINT``) is
    the collector's base URL, ``/v1/traces`` is added as OTLP/HTTP specifies, unless it is there
    already; ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (without ``endpoint``) is used as it is."""
    if endpoint is None:
        traces = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        endpoint = traces or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        if not endpoint:
            raise ConfigurationError(
                "no OTLP endpoint: give --endpoint URL (an OTLP/HTTP collector's base URL, "
                "e.g. http://127.0.0.1:4318) or set OTEL_EXPORTER_OTLP_ENDPOINT"
            )
        if traces:
            return endpoint
    parts = urllib.parse.urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(
            f"the OTLP endpoint must be an http:// or https:// URL, got {shown(endpoint)!r}"
        )
    path = parts.path.rstrip("/")
    if not path.endswith(TRACES_PATH):
        path += TRACES_PATH
    return urllib.parse.urlunsplit(parts._replace(path=path))


def shown(url: str) -> str:
    """``url`` as it may be printed: without its user and password, credential-named query
    values redacted."""
    remember_query(url)
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    return redact(urllib.parse.urlunsplit(parts._replace(netloc=netloc)))


class _Redacting(logging.Filter):
    """Redacts the exporter's log lines (a header value, a URL's password) and keeps the last
    one, the reason an export failed."""

    def __init__(self) -> None:
        super().__init__()
        self.last: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        text = redact(record.getMessage())
        record.msg, record.args = text, None
        self.last = text
        return True


def export_otlp(
    paths: Iterable[str | os.PathLike[str]],
    endpoint: str | None = None,
    headers: Mapping[str, str] | None = None,
    *,
    best_per_group: bool = False,
    min_reward: float | None = None,
    split: Split = "all",
    batch_size: int = 512,
) -> ExportSummary:
    """Send the runs under ``paths`` as OTel GenAI spans to the OTLP/HTTP ``endpoint``
    (default ``OTEL_EXPORTER_OTLP_ENDPOINT``) with ``headers`` (default
    ``OTEL_EXPORTER_OTLP_HEADERS``); every run by default, the selection as
    :func:`~arttrace.exports.export_sft`'s."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    started = time.perf_counter()
    url = endpoint_url(endpoint)
    if batch_size < 1:
        raise ConfigurationError(f"batch_size must be at least 1, got {batch_size}")
    for value in (headers or {}).values():
        remember(value)  # redacted from every text arttrace writes from now on
    selection = Selection(split, min_reward, best_per_group)
    summary = ExportSummary("otlp", shown(url))
    exporter = OTLPSpanExporter(endpoint=url, headers=dict(headers) if headers else None)
    replay = _Replay()
    redacting = _Redacting()
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    for logger in loggers:
        logger.addFilter(redacting)

    pending = 0  # runs whose spans wait in the batch (a batch ends with a run's last span)

    def send() -> None:
        nonlocal pending
        batch, replay.ended = replay.ended, []
        if not batch:
            return
        if exporter.export(batch) is not SpanExportResult.SUCCESS:
            why = redacting.last or "no reason given"
            raise ExportError(
                f"the OTLP endpoint {summary.destination} did not take a batch of "
                f"{len(batch)} spans ({why}); {summary.rows} spans of {summary.runs} runs were "
                "sent before it. Check the URL, the headers it needs (--header NAME=VALUE) and "
                "that the collector accepts OTLP/HTTP protobuf"
            )
        summary.rows += len(batch)
        summary.runs, pending = summary.runs + pending, 0

    try:
        for run in selected(paths, selection, summary.skipped):
            replay.run(run, run.load())
            pending += 1
            if len(replay.ended) >= batch_size:
                send()
        send()
    finally:
        for logger in loggers:
            logger.removeFilter(redacting)
        replay.provider.shutdown()
        exporter.shutdown()
    summary.seconds = time.perf_counter() - started
    return summary


class _Replay:
    """A tracer provider of its own (never the application's global one) whose spans, once
    ended, wait in ``ended`` for the next batch."""

    def __init__(self) -> None:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
        from opentelemetry.sdk.trace.id_generator import IdGenerator
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON

        self.ended: list[ReadableSpan] = []
        replay = self

        class Collect(SpanProcessor):
            def on_end(self, span: ReadableSpan) -> None:
                replay.ended.append(span)

        class Ids(IdGenerator):
            """Ids drawn from a generator seeded by the run: the same run, the same ids."""

            def __init__(self) -> None:
                self.random = random.Random()

            def generate_span_id(self) -> int:
                return self.random.getrandbits(64) or 1

            def generate_trace_id(self) -> int:
                return self.random.getrandbits(128) or 1

        self.ids = Ids()
        service = os.environ.get("OTEL_SERVICE_NAME") or "arttrace"
        self.provider = TracerProvider(
            sampler=ALWAYS_ON,
            resource=Resource.create({SERVICE_NAME: service}),
            id_generator=self.ids,
            shutdown_on_exit=False,
        )
        self.provider.add_span_processor(Collect())
        self.tracer = self.provider.get_tracer("arttrace", importlib.metadata.version("arttrace"))

    def run(self, run: Run, trajectory: Trajectory) -> None:
        from opentelemetry import trace
        from opentelemetry.context import Context
        from opentelemetry.trace import SpanKind, Status, StatusCode

        calls = trajectory.calls
        begin = trajectory.started_at or min((c.started_at for c in calls), default=time.time())
        end = trajectory.ended_at or max((c.ended_at or c.started_at for c in calls), default=begin)
        seed = f"{run.run_dir.resolve()}|{run.key}|{run.row.example_id}|{begin}"
        self.ids.random.seed(hashlib.sha256(seed.encode()).digest())
        attributes: dict[str, Any] = {
            "arttrace.example_id": trajectory.example_id,
            "arttrace.reward": trajectory.reward,
            "arttrace.step": run.row.step,
            "arttrace.position": run.row.position,
            "arttrace.rollout": run.row.rollout,
            "arttrace.split": run.row.split,
            "arttrace.policy_step": run.row.policy_step,
        }
        root = self.tracer.start_span(
            f"trajectory {trajectory.example_id}",
            context=Context(),  # a trace of its own
            attributes={k: v for k, v in attributes.items() if v is not None},
            start_time=_ns(begin),
        )
        parent = trace.set_span_in_context(root)
        for call in calls:
            span = self.tracer.start_span(
                f"chat {call.model}",
                context=parent,
                kind=SpanKind.CLIENT,
                attributes={
                    **_request_attributes(call, trajectory, None),
                    **_response_attributes(call, export_tokens=False),
                },
                start_time=_ns(call.started_at),
            )
            if call.error:
                span.set_status(Status(StatusCode.ERROR, redact(call.error)))
            span.end(end_time=_ns(call.ended_at or call.started_at))
        if trajectory.exception is not None:
            exception = trajectory.exception
            root.add_event(
                "exception",
                {
                    "exception.type": str(exception.get("type")),
                    "exception.message": redact(str(exception.get("message") or "")),
                    "exception.stacktrace": redact(str(exception.get("traceback") or "")),
                },
                timestamp=_ns(end),
            )
            root.set_status(Status(StatusCode.ERROR, str(exception.get("type"))))
        root.end(end_time=_ns(end))


def _ns(seconds: float) -> int:
    return round(seconds * 1_000_000_000)
