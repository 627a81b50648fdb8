"""The viewer's ASGI app: the pages (static files shipped in the package) and their JSON API.

Read-only: GET (and HEAD) only, every other method is 405. A request whose ``Host`` is not
this server's own name is refused (a web page reaching ``127.0.0.1`` through DNS rebinding
would otherwise read the runs' prompts), and no answer carries CORS headers, so other sites'
pages cannot read it either.

The API (JSON; ``r`` is a folder's place in the command line, from 0)::

    GET /api/runs                                 the folders: state, kind, version, problem,
                                                  tokenizer
    GET /api/runs/{r}/overview                    steps and validations as chart columns
    GET /api/runs/{r}/steps/{step}                the step's row and its groups
    GET /api/runs/{r}/steps/{step}/groups/{pos}?policy
                                                  a group and its runs (reward, advantage)
    GET /api/runs/{r}/trajectories?filters        runs found (paged: limit <= 200, offset)
    GET /api/runs/{r}/trajectories/{id}           a run as ART trains on it
    GET /api/runs/{r}/trajectories/{id}/items/{conversation}/{item}?offset&limit
                                                  one message or turn whole, tokens paged
    GET /api/runs/{r}/causes                      untrainable cause -> runs having it
    GET /api/runs/{r}/policies                    the run's policies -> runs holding a turn
                                                  of each, and the frozen ones
"""

from __future__ import annotations

import hashlib
import html
import logging
import os
import time
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

from .._asgi_server import ServerThread
from .._tokenizers._find import Decoder, load_given
from ..capture._trajectory import Trajectory
from ..store import GroupRow, RunStore
from . import _present
from ._runs import REFRESH_SECONDS, NotReady, Runs, RunSlot

_log = logging.getLogger("arttrace")
_STATIC = Path(str(resources.files("arttrace.viewer") / "static"))
MAX_PAGE = 200
"""Runs per page of a search."""
_ALLOW = {"allow": "GET, HEAD"}
_ORDERS = ("step", "-step", "reward", "-reward", "id", "-id")
"""The store's orders (``arttrace.store._store.ORDERS``; ``-``: descending)."""
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


class _Kept(StaticFiles):
    """The pages' files, kept by the browser: their URL holds :func:`_version` of them, so a
    changed file has a new URL (no stale script after an upgrade, no revalidation before)."""

    def file_response(
        self, full_path: Any, stat_result: os.stat_result, scope: Scope, status_code: int = 200
    ) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        response.headers["cache-control"] = "public, max-age=31536000, immutable"
        return response


def _version() -> str:
    """A name for this set of static files (their names, sizes and modification times)."""
    digest = hashlib.sha256()
    for path in sorted(_STATIC.rglob("*")):
        if path.is_file():
            status = path.stat()
            digest.update(
                f"{path.relative_to(_STATIC)}:{status.st_size}:{status.st_mtime_ns};".encode()
            )
    return digest.hexdigest()[:12]


class ApiError(Exception):
    def __init__(self, status: int, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.status, self.message, self.fix = status, message, fix


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(data),
        status,
        media_type="application/json",
        headers={"cache-control": "no-store", **(headers or {})},
    )


class Viewer:
    """The web app over ``paths``; :meth:`start` serves it, :meth:`stop` ends it. In a
    notebook, a started viewer shown as a cell's value is a link to it."""

    def __init__(
        self,
        paths: Sequence[str | os.PathLike[str]],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        refresh_seconds: float | None = None,
        tokenizer: str | os.PathLike[str] | Decoder | None = None,
    ) -> None:
        """``tokenizer``: what gives every folder's token ids their text (a folder a
        tokenizer was saved in, or a model name in the Hugging Face cache; loaded here, a
        :class:`~arttrace._tokenizers._find.TokenizerError` when it cannot be); ``None``: each
        folder's own, found in it or from its runs' model (see :mod:`._tokens`)."""
        self.host, self.port = host, port
        decoder = (
            tokenizer
            if tokenizer is None or isinstance(tokenizer, Decoder)
            else load_given(tokenizer)
        )
        self.runs = Runs(
            [Path(p) for p in paths],
            REFRESH_SECONDS if refresh_seconds is None else refresh_seconds,
            decoder,
        )
        self.allowed_hosts: set[str] = set()
        version = _version()
        self.static = f"static/{version}/"
        self._page = (_STATIC / "index.html").read_text().replace('"static/', f'"{self.static}')
        routes = [
            Route("/", self._index),
            Route("/api/runs", self._list),
            Route("/api/runs/{r:int}/overview", self._overview),
            Route("/api/runs/{r:int}/steps/{step:int}", self._step),
            Route("/api/runs/{r:int}/steps/{step:int}/groups/{position:int}", self._group),
            Route("/api/runs/{r:int}/trajectories", self._find),
            Route("/api/runs/{r:int}/trajectories/{id:int}", self._trajectory),
            Route(
                "/api/runs/{r:int}/trajectories/{id:int}/items/{conversation:int}/{item:int}",
                self._item,
            ),
            Route("/api/runs/{r:int}/causes", self._causes),
            Route("/api/runs/{r:int}/policies", self._policies),
            Route("/api/{rest:path}", self._no_route),
            Mount(f"/static/{version}", _Kept(directory=_STATIC), name="static"),
        ]
        self.app = Starlette(routes=routes, exception_handlers={HTTPException: self._http_error})
        self.server: ServerThread | None = None

    # -- serving ---------------------------------------------------------------------------

    def start(self) -> str:
        """Serve on ``host:port`` (port 0: a free one) in a thread of its own; the URL."""
        self.server = ServerThread(self, self.host, self.port, name="arttrace view")
        self.allowed_hosts = _allowed_hosts(self.host, self.server.address[1])
        self.runs.start()
        self.server.start()
        return self.url

    @property
    def url(self) -> str:
        assert self.server is not None, "start() the viewer first"
        host, port = self.server.address
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/"

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.runs.stop()

    def __repr__(self) -> str:
        where = "not started" if self.server is None else self.url
        return f"<arttrace view: {where}>"

    def _repr_html_(self) -> str:
        """Jupyter's rendering: a link that opens the viewer in a new tab."""
        if self.server is None:
            return html.escape(repr(self))
        url = html.escape(self.url)
        return f'arttrace view: <a href="{url}" target="_blank">{url}</a>'

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refused = self._refusal(scope)
            if refused is not None:
                await refused(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> Response | None:
        if scope["method"] not in ("GET", "HEAD"):
            return _json(
                {"error": f"{scope['method']} is not allowed: the viewer is read-only (GET)"},
                405,
                _ALLOW,
            )
        host = next((v for k, v in scope["headers"] if k == b"host"), b"").decode("latin-1")
        if self.allowed_hosts and host.lower() not in self.allowed_hosts:
            return _json(
                {
                    "error": f"this viewer answers to {sorted(self.allowed_hosts)[0]}, not to "
                    f"Host {host!r}",
                    "fix": "open the URL `arttrace view` printed",
                },
                421,
            )
        return None

    # -- pages -----------------------------------------------------------------------------

    async def _index(self, request: Request) -> Response:
        """The page, with ``/api/runs``'s answer in it (the app's first question)."""
        runs = orjson.dumps(self._listing()).replace(b"</", b"<\\/").decode()
        script = f'<script id="runs-now" type="application/json">{runs}</script>'
        page = self._page.replace("</body>", f"  {script}\n</body>")
        return HTMLResponse(page, headers={"cache-control": "no-cache"})

    async def _no_route(self, request: Request) -> Response:
        return _json({"error": f"no API route {request.url.path}"}, 404)

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 405:
            return _json({"error": "the viewer is read-only (GET)"}, 405, _ALLOW)
        return _json({"error": f"{exc.detail}: {request.url.path}"}, exc.status_code)

    # -- the API ---------------------------------------------------------------------------

    async def _list(self, request: Request) -> Response:
        return _json(self._listing())

    def _listing(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "runs": [
                {
                    "index": s.index,
                    "path": s.given,
                    "absolute": str(s.path),
                    "label": s.label,
                    "kind": s.kind,
                    "state": s.state,
                    "version": s.version,
                    "problem": None
                    if s.problem is None
                    else {"message": s.problem.message, "fix": s.problem.fix},
                    "tokenizer": s.tokenizer(),
                    "opening_seconds": round(now - s.opening_since, 1)
                    if s.state == "opening"
                    else None,
                }
                for s in self.runs.slots
            ]
        }

    async def _overview(self, request: Request) -> Response:
        metric = request.query_params.get("metric") or None

        def query(store: RunStore) -> dict[str, Any]:
            data = _present.overview(store.steps(), store.validations(), metric, store.policies())
            last = store.trajectories(order="-step", limit=1)
            data["runs"] = store.count()
            data["last_journal_step"] = last[0].step if last else None
            return data

        return await self._answer(request, query)

    async def _step(self, request: Request) -> Response:
        step = int(request.path_params["step"])

        def query(store: RunStore) -> dict[str, Any]:
            row = next((s for s in store.steps() if s.step == step), None)
            groups = store.groups(step)
            return {
                "step": None if row is None else _present.row(row),
                "groups": [_present.row(g) for g in groups[:1000]],
                "groups_total": len(groups),
            }

        return await self._answer(request, query)

    async def _group(self, request: Request) -> Response:
        step, position = int(request.path_params["step"]), int(request.path_params["position"])
        policy = request.query_params.get("policy") or None

        def query(store: RunStore) -> dict[str, Any]:
            group = next((g for g in store.groups(step, policy) if g.position == position), None)
            if group is None:
                of = "" if policy is None else f" of policy {policy!r}"
                raise ApiError(404, f"step {step} has no group{of} at position {position}")
            runs = _group_runs(store, group)
            example = _present.example(store.trajectory(runs[0]["id"])) if runs else []
            return {"group": _present.row(group), "runs": runs, "example": example}

        return await self._answer(request, query)

    async def _find(self, request: Request) -> Response:
        filters, order, limit, offset = _filters(request)

        def query(store: RunStore) -> dict[str, Any]:
            rows = store.trajectories(**filters, order=order, limit=limit, offset=offset)
            return {
                "total": store.count(**filters),
                "offset": offset,
                "limit": limit,
                "rows": [_present.row(r) for r in rows],
            }

        return await self._answer(request, query)

    async def _trajectory(self, request: Request) -> Response:
        row_id = int(request.path_params["id"])
        decoder = self._slot(request).decoder

        def query(store: RunStore) -> dict[str, Any]:
            view = _present.run_view(
                _load(store, row_id),
                None if decoder is None else decoder.texts,
                _training(store),
            )
            view["id"] = row_id
            view["row"], groups = _placed(store, row_id)
            view["group"], view["groups"] = (groups[0] if groups else None), groups
            view["run_policies"] = store.policies()
            view["frozen_policies"] = store.frozen_policies()
            return view

        return await self._answer(request, query)

    async def _item(self, request: Request) -> Response:
        p = request.path_params
        offset = _int(request, "offset", 0, minimum=0)
        limit = _int(request, "limit", 10_000, minimum=1, maximum=100_000)
        decoder = self._slot(request).decoder

        def query(store: RunStore) -> dict[str, Any]:
            found = _present.item_view(
                _load(store, int(p["id"])),
                int(p["conversation"]),
                int(p["item"]),
                offset,
                limit,
                None if decoder is None else decoder.texts,
                _training(store),
            )
            if found is None:
                raise ApiError(404, "this run has no such message")
            return found

        return await self._answer(request, query)

    async def _causes(self, request: Request) -> Response:
        return await self._answer(request, lambda store: {"causes": store.causes()})

    async def _policies(self, request: Request) -> Response:
        def query(store: RunStore) -> dict[str, Any]:
            return {
                "policies": {p: store.count(policy=p) for p in store.policies()},
                "frozen": store.frozen_policies(),
            }

        return await self._answer(request, query)

    async def _answer(self, request: Request, query: Callable[[RunStore], Any]) -> Response:
        """``query`` on the folder's store, or a JSON error that says what to do: never a
        traceback."""
        slot = self._slot(request)
        try:
            return _json(await slot.read(query))
        except NotReady:
            return _json(_not_ready(slot), 503)
        except ApiError as error:
            return _json({"error": error.message, "fix": error.fix}, error.status)
        except Exception as error:
            from ._runs import problem_of

            problem = problem_of(slot.path, error)
            if problem.fix.startswith("This looks like a bug"):
                _log.exception("arttrace view: %s failed", request.url.path)
            return _json({"error": problem.message, "fix": problem.fix}, 500)

    def _slot(self, request: Request) -> RunSlot:
        slot = self.runs.get(int(request.path_params["r"]))
        if slot is None:
            raise HTTPException(404, "no such run folder")
        return slot


def _not_ready(slot: RunSlot) -> dict[str, Any]:
    if slot.problem is not None:
        return {"state": slot.state, "error": slot.problem.message, "fix": slot.problem.fix}
    return {
        "state": slot.state,
        "error": f"indexing {slot.path} (the first time takes a while on a big run)",
        "fix": "",
    }


def _training(store: RunStore) -> dict[str, bool] | None:
    """A run of several policies' declared ones, and whether each trains (``None``: one)."""
    trained = store.trained_policies()
    if trained is None:
        return None
    return {**dict.fromkeys(store.frozen_policies(), False), **dict.fromkeys(trained, True)}


def _load(store: RunStore, row_id: int) -> Trajectory:
    try:
        return store.trajectory(row_id)
    except (KeyError, IndexError, LookupError):
        raise ApiError(404, f"no run {row_id} in this folder") from None


def _group_runs(store: RunStore, group: GroupRow) -> list[dict[str, Any]]:
    """The group's runs in rollout order, each with its advantage (the group's, in the same
    order)."""
    rows = [
        r
        for r in store.trajectories(
            step=group.step, example_id=group.example_id, limit=min(4 * group.runs + 100, 5000)
        )
        if r.position == group.position
    ]
    if any(not r.set_aside for r in rows):  # runs set aside count only in a step of no other
        rows = [r for r in rows if not r.set_aside]
    rows.sort(key=lambda r: (r.rollout is None, r.rollout, r.id))
    advantages = list(group.advantages)
    out = []
    for k, r in enumerate(rows):
        data = _present.row(r)
        data["advantage"] = advantages[k] if len(advantages) == len(rows) else None
        if group.policy is not None:  # the policy's group: its reward for that policy
            data["reward"] = r.reward_for(group.policy)
        out.append(data)
    return out


def _placed(store: RunStore, row_id: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The run's row, and its group's (with the run's advantage), when the run has a step: one
    per policy in a run of several."""
    found = store.row(row_id)
    if found.step is None or found.position is None:
        return _present.row(found), []
    groups = []
    for group in store.groups(found.step):
        if group.position != found.position:
            continue
        data = _present.row(group)
        data["advantage"] = next(
            (r["advantage"] for r in _group_runs(store, group) if r["id"] == row_id), None
        )
        groups.append(data)
    return _present.row(found), groups


def _int(
    request: Request, name: str, default: int, *, minimum: int = 0, maximum: int | None = None
) -> int:
    text = request.query_params.get(name)
    if text in (None, ""):
        return default
    try:
        value = int(text)
    except ValueError:
        raise HTTPException(400, f"{name} must be a whole number, got {text!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        raise HTTPException(400, f"{name} must be from {minimum} to {maximum}, got {value}")
    return value


def _float(request: Request, name: str) -> float | None:
    text = request.query_params.get(name)
    if text in (None, ""):
        return None
    try:
        return float(text)
    except ValueError:
        raise HTTPException(400, f"{name} must be a number, got {text!r}") from None


def _filters(request: Request) -> tuple[dict[str, Any], str, int, int]:
    """The search's filters (the store's names), order, page size and offset."""
    q = request.query_params
    filters: dict[str, Any] = {
        "step": None if q.get("step") in (None, "") else _int(request, "step", 0),
        "split": q.get("split") or None,
        "example_id": q.get("example_id") or None,
        "min_reward": _float(request, "min_reward"),
        "max_reward": _float(request, "max_reward"),
        "cause": q.get("cause") or None,
        "text": q.get("text") or None,
        "node": q.get("node") or None,
        "policy": q.get("policy") or None,
    }
    if filters["split"] not in (None, "train", "val"):
        raise HTTPException(400, f"split is train or val, got {filters['split']!r}")
    order = q.get("order") or "step"
    if order not in _ORDERS:
        raise HTTPException(400, f"order is one of {', '.join(_ORDERS)}, got {order!r}")
    limit = _int(request, "limit", 50, minimum=1, maximum=MAX_PAGE)
    offset = _int(request, "offset", 0, minimum=0)
    return {k: v for k, v in filters.items() if v is not None}, order, limit, offset


def _allowed_hosts(host: str, port: int) -> set[str]:
    """The ``Host`` values this server answers to: its address, and the loopback names when
    it listens on one (``set()``, any, when it listens on every address: its name is then
    whatever the network calls this machine)."""
    if host in ("0.0.0.0", "::", ""):
        return set()
    names = {host.lower(), f"[{host.lower()}]"}
    if host in _LOOPBACK or host.startswith("127."):
        names |= _LOOPBACK
    return {f"{n}:{port}" for n in names} | names
