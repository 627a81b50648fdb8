"""A stand-in for ART's serverless training API (W&B Training), on 127.0.0.1.

It answers the routes that openpipe-art 0.5.23's ``art.ServerlessBackend`` calls for
``model.register(backend)`` and ``backend.train(model, groups, ...)``
(``art/serverless/client.py`` and ``backend.py``):

- ``POST /v1/preview/models`` -> the model (``id``, ``entity``, ``run_id``, ...)
- ``POST /v1/preview/training-jobs`` ``{model_id, trajectory_groups, experimental_config}``
  -> ``{id}``
- ``GET /v1/preview/training-jobs/{id}/events?after=<event id>``: a cursor page of events,
  polled once a second until ``training_ended`` (or ``training_failed``)
- ``GET /v1/preview/models/{id}/checkpoints?limit=1&order=desc``: the latest checkpoint
  (``train()`` reads its step after the job ends)

Every request must carry ``Authorization: Bearer <api_key>``. Jobs are recorded in ``jobs``.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


class FakeServerlessAPI:
    def __init__(self, api_key: str) -> None:
        self.api_key = api_key
        self.models: list[dict[str, Any]] = []
        self.jobs: list[dict[str, Any]] = []
        """The body of each ``POST /preview/training-jobs``, in order."""
        self.requests: list[tuple[str, str]] = []
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def route(self, method: str, url: str, body: Any) -> tuple[int, Any]:
        path, query = urlsplit(url).path, parse_qs(urlsplit(url).query)
        self.requests.append((method, path))
        if method == "POST" and path == "/v1/preview/models":
            model = {**body, "id": f"model-{len(self.models)}", "entity": "team", "run_id": "run-0"}
            self.models.append(model)
            return 200, model
        if method == "POST" and path == "/v1/preview/training-jobs":
            self.jobs.append(body)
            return 200, {"id": f"job-{len(self.jobs)}"}
        if method == "GET" and re.fullmatch(r"/v1/preview/training-jobs/job-\d+/events", path):
            events = [
                {"id": "e1", "type": "training_started", "data": {"num_sequences": 1}},
                {"id": "e2", "type": "gradient_step", "data": {"loss": 0.25, "grad_norm": 1.5}},
                {"id": "e3", "type": "training_ended", "data": {}},
            ]
            after = query.get("after", [None])[0]
            ids = [e["id"] for e in events]
            start = ids.index(after) + 1 if after in ids else 0
            return 200, {"data": events[start:], "has_more": False}
        if method == "GET" and re.fullmatch(r"/v1/preview/models/model-\d+/checkpoints", path):
            step = len(self.jobs)
            return 200, {"data": [{"id": f"ckpt-{step}", "step": step, "metrics": {}}] * bool(step)}
        return 404, {"error": {"message": f"no route {method} {path}"}}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self._answer("POST")

            def _answer(self, method: str) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"null")
                if self.headers.get("authorization") != f"Bearer {api.api_key}":
                    status, payload = 401, {"error": {"message": "bad api key"}}
                else:
                    status, payload = api.route(method, self.path, body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
