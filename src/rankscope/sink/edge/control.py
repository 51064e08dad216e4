"""The sink's control routes on HTTP, apart from OTLP ingest: what embedded clients and people ask.

``GET /healthz`` (503 naming a dead sink thread; no token needed), and behind the bearer token
(``edge.auth``; a scoped token sees only its scope's experiments, ``scoped``):
``POST /rankscope/v1/config`` (an experiment's views),
``GET /rankscope/v1/status[?experiment=ID[&run=RUN]]`` (a route that names an experiment
takes ``run``, else means its latest run; a resuming launch's own run id means the run it
continues),
``GET /rankscope/v1/spans?experiment=ID[&first=N][&last=M][&ranks=0,2-3]`` (stored spans as
JSONL, streamed; what ``rankscope gantt --sink`` reads),
``GET /rankscope/v1/recent?experiment=ID`` (the last 64 finalized steps: values, missing,
anomalies, rank x phase seconds; what ``rankscope top`` reads), captures (``sink.views.captures``):
``POST /rankscope/v1/captures`` (``{"experiment", "steps", "ranks", "reason"}``: ask for one),
``GET /rankscope/v1/captures?experiment=ID&process=PID`` (a process polls for its requests) and
``PUT /rankscope/v1/captures/file?experiment=ID&capture=C&process=PID`` (its trace, gzip), and
``POST /rankscope/v1/report`` (``{"experiment"}``: write its report page now, answer where).

Every body is JSON, checked here; the sink's side (the ``Control`` port, ``edge.ports``) takes
checked values only, and says no with an ``edge.errors.Refusal`` whose kind chooses the status.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from aiohttp import web

from ..book.traces import parse_ranks
from ..checked import ALL, Scope, SpanQuery, clean_text
from ..views.captures import MAX_RANKS, MAX_STEPS
from .auth import UNAUTHORIZED, Keys
from .errors import HttpError, Kind, OverloadedError, Refusal
from .ports import Client, Control, ControlCommands, ControlQueries

REPORT_TIMEOUT = 60.0
"""Seconds the report route waits for an experiment's views (``request_report`` waits longer)."""

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


class ControlRoutes:
    """The control routes of one sink, answered by its ``Control`` port behind ``keys`` (each
    token sees the experiments of its scope only: ``scoped``). ``call``
    runs a blocking call off the event loop, ``body`` reads a request body within the sink's size
    limit (both from the HTTP transport)."""

    def __init__(
        self,
        control: Control,
        keys: Keys,
        call: Callable[..., Awaitable[Any]],
        body: Callable[[web.BaseRequest], Awaitable[bytes]],
        *,
        max_id_chars: int = 256,
    ) -> None:
        self.control = control
        self.keys = keys
        self.max_id_chars = max_id_chars
        """An experiment id a body may name (the OTLP edge's bound, ``checked.Limits.max_id_chars``)."""
        self._call = call
        self._body = body
        self._report_lock = threading.Lock()
        self._reporting: set[str] = set()
        self.routes: dict[tuple[str, str], Handler] = {
            ("GET", "/rankscope/v1/status"): self._status,
            ("GET", "/rankscope/v1/spans"): self._spans,
            ("GET", "/rankscope/v1/recent"): self._recent,
            ("GET", "/rankscope/v1/captures"): self._pending,
            ("POST", "/rankscope/v1/config"): self._config,
            ("POST", "/rankscope/v1/captures"): self._capture,
            ("POST", "/rankscope/v1/report"): self._report,
            ("PUT", "/rankscope/v1/captures/file"): self._capture_file,
        }

    def serves(self, path: str) -> bool:
        return path == "/healthz" or path.startswith("/rankscope/")

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.path == "/healthz" and request.method == "GET":
            return await self._health(request)
        scope = self.keys.scope_of_headers(request.headers.getall("Authorization", []))
        if scope is None:
            raise HttpError(Kind.UNAUTHORIZED, UNAUTHORIZED)
        request[_CONTROL] = self.control if scope is ALL else scoped(self.control, scope)
        handler = self.routes.get((request.method, request.path))
        if handler is None:
            if any(path == request.path for _, path in self.routes):
                raise HttpError(Kind.METHOD_NOT_ALLOWED, f"{request.method} is not served at {request.path[:200]!r}")
            raise HttpError(Kind.NO_ROUTE, f"nothing at {request.path[:200]!r}")
        return await handler(request)

    async def _config(self, request: web.BaseRequest) -> web.Response:
        body = await self._body(request)
        try:
            payload = _json(body)
            experiment, backends = payload["experiment"], payload["backends"]
            if not isinstance(experiment, str) or not isinstance(backends, dict):
                raise TypeError("experiment must be a string and backends an object")
            self._check_id(experiment)
            if not all(isinstance(v, dict) for v in backends.values()):
                raise TypeError("each backend's options must be an object")
            if _deeper(backends, MAX_CONFIG_DEPTH):
                raise ValueError(f"backends nest deeper than {MAX_CONFIG_DEPTH} levels")
        except (ValueError, KeyError, TypeError) as exc:
            raise HttpError(Kind.BAD_REQUEST, f"bad config body: {exc}") from None
        answer = await self._call(_control(request).commands.configure, experiment, backends)  # it takes runs' locks
        return web.json_response({"result": answer})

    def _check_id(self, experiment: str) -> None:
        """Raise ``ValueError`` for an experiment id the OTLP edge would refuse (``edge.validate``)."""
        limit = self.max_id_chars
        if clean_text(experiment, limit) is None:
            shown = f"of {len(experiment)} characters" if len(experiment) > limit else repr(experiment[:64])
            raise ValueError(f"experiment id {shown} is empty, over {limit} characters or holds control characters")

    async def _health(self, request: web.BaseRequest) -> web.StreamResponse:
        healthy, problems = self.control.queries.health()
        text = "ok\n" if healthy else "".join(f"{p}\n" for p in problems)
        return web.Response(status=200 if healthy else 503, text=text)

    async def _status(self, request: web.BaseRequest) -> web.StreamResponse:
        query = parse_qs(request.query_string)
        experiment = query.get("experiment", [None])[0]
        if experiment is None:  # both take runs' locks: on the pool, never on the loop that answers everyone
            return web.json_response(await self._call(_control(request).queries.overview))
        found = await self._call(_control(request).queries.status, experiment, _run(query))
        if found is None:
            raise HttpError(Kind.NOT_FOUND, f"no experiment {experiment[:200]!r}; GET /rankscope/v1/status lists them")
        return web.json_response(found)

    async def _recent(self, request: web.BaseRequest) -> web.StreamResponse:
        query = parse_qs(request.query_string)
        experiment = query.get("experiment", [""])[0]
        found = await self._call(_control(request).queries.recent, experiment, _run(query))
        if found is None:
            raise HttpError(Kind.NOT_FOUND, f"no experiment {experiment[:200]!r}")
        return web.json_response(found)

    async def _pending(self, request: web.BaseRequest) -> web.StreamResponse:
        query = parse_qs(request.query_string)
        experiment, process = query.get("experiment", [""])[0], query.get("process", [""])[0]
        return web.json_response(await self._call(_control(request).commands.pending_captures, experiment, process))

    async def _report(self, request: web.BaseRequest) -> web.Response:
        body = await self._body(request)
        try:
            payload = _json(body)
            experiment, run = payload["experiment"], payload.get("run")
            if not isinstance(experiment, str) or not isinstance(run, (str, type(None))):
                raise TypeError("experiment (and run) must be strings")
            self._check_id(experiment)
        except (ValueError, KeyError, TypeError) as exc:
            raise HttpError(Kind.BAD_REQUEST, f"bad report request: {exc}") from None
        with self._report_lock:  # one page at a time per experiment; others' pages go on
            busy = experiment in self._reporting or len(self._reporting) >= 8
            if not busy:
                self._reporting.add(experiment)
        if busy:
            raise HttpError(Kind.BUSY, "this experiment's report (or 8 others) is being written; ask again")
        try:  # its own thread: waiting on the views never holds the pool that decodes data
            answer = await asyncio.to_thread(_control(request).commands.report, experiment, REPORT_TIMEOUT, run)
        finally:
            with self._report_lock:
                self._reporting.discard(experiment)
        if isinstance(answer, Refusal):
            raise HttpError(answer.kind, answer)
        return web.json_response({"experiment": experiment, "reports": answer})

    async def _capture(self, request: web.BaseRequest) -> web.Response:
        body = await self._body(request)
        try:
            payload = _json(body)
            experiment, steps = payload["experiment"], payload.get("steps", 2)
            ranks, run, reason = payload.get("ranks"), payload.get("run"), payload.get("reason") or "asked"
            if not isinstance(experiment, str) or isinstance(steps, bool) or not isinstance(steps, int):
                raise TypeError("experiment must be a string and steps an int")
            self._check_id(experiment)
            if not isinstance(run, (str, type(None))) or not isinstance(reason, str):
                raise TypeError("run and reason must be strings")
            if not 1 <= steps <= MAX_STEPS:
                raise ValueError(f"steps must be in [1, {MAX_STEPS}], got {steps}")
            if ranks is not None and not (isinstance(ranks, list) and all(type(r) is int for r in ranks)):
                raise TypeError("ranks must be a list of ints")
            if ranks is not None and len(ranks) > MAX_RANKS:
                raise ValueError(f"at most {MAX_RANKS} ranks, got {len(ranks)}")
            if ranks is not None and not all(0 <= r < MAX_RANK for r in ranks):
                raise ValueError(f"ranks must be in [0, {MAX_RANK}), got {min(ranks)} to {max(ranks)}")
        except (ValueError, KeyError, TypeError) as exc:
            raise HttpError(Kind.BAD_REQUEST, f"bad capture request: {exc}") from None
        chosen = None if ranks is None else frozenset(ranks)
        answer = await self._call(_control(request).commands.capture, experiment, reason, steps, chosen, run)
        if isinstance(answer, Refusal):  # what is left to refuse: an unknown experiment, or its rate limits
            raise HttpError(answer.kind, answer)
        return web.json_response(answer)

    async def _capture_file(self, request: web.BaseRequest) -> web.Response:
        query = parse_qs(request.query_string)
        experiment, capture, process = (query.get(k, [""])[0] for k in ("experiment", "capture", "process"))
        if request.content_length is None:
            raise HttpError(Kind.LENGTH_REQUIRED, "a capture file needs a Content-Length")
        try:  # before the body is read: a file nobody asked for costs nothing
            await self._call(
                _control(request).queries.capture_target, experiment, capture, process, request.content_length
            )
            body = await self._body(request)
            path = await self._call(_control(request).commands.store_capture, experiment, capture, process, body)
        except LookupError as exc:
            raise HttpError(Kind.NOT_FOUND, str(exc)) from None
        except OverloadedError as exc:
            raise HttpError(exc.kind, str(exc)) from None
        return web.json_response({"path": path})

    async def _spans(self, request: web.BaseRequest) -> web.StreamResponse:
        query = parse_qs(request.query_string)
        experiment = query.get("experiment", [""])[0]
        try:
            first = int(query["first"][0]) if "first" in query else None
            last = int(query["last"][0]) if "last" in query else None
            ranks = parse_ranks(query.get("ranks", [""])[0])
        except ValueError as exc:
            raise HttpError(Kind.BAD_REQUEST, f"bad span query: {exc}") from None
        asked = SpanQuery(experiment, first, last, None if ranks is None else frozenset(ranks), _run(query))
        rows = await self._call(_control(request).queries.span_rows, asked)
        if rows is None:
            raise HttpError(Kind.NOT_FOUND, f"no experiment {experiment[:200]!r}")
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/x-ndjson"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        while chunk := await self._call(lambda: list(itertools.islice(rows, 1000))):
            await response.write("".join(chunk).encode())
        await response.write_eof()
        return response


_CONTROL = web.RequestKey("rankscope.control", Control)
"""Where ``handle`` leaves the request's view of the ``Control`` port (its token's scope)."""


def _control(request: web.BaseRequest) -> Control:
    """The ``Control`` port as the request's token sees it (set by ``ControlRoutes.handle``)."""
    return request[_CONTROL]


def scoped(control: Control, scope: Scope) -> Control:
    """The ``Control`` port as a scoped token sees it: an experiment outside its scope does not
    exist for it (404, like an unknown one), and its views cannot be configured from it. No answer
    holds another scope's experiments or names: the overview lists the scope's own runs and run
    notes and leaves out the sink-wide counts (``SCOPED_OVERVIEW``); a run's status names no other
    scope (``OTHER_SCOPE``)."""
    return Control(ScopedQueries(control.queries, scope), ScopedCommands(control.commands, scope))


SCOPED_OVERVIEW = ("healthy", "problems", "experiments", "runs", "experiment_list", "run_notes", "durable")
"""What of the overview a scoped token sees: the sink's health (``/healthz`` says it to anyone),
its own experiments and runs, its own run notes. The rest counts every scope's traffic (refusals
by kind, spans, evictions, descriptors, connections, admission's clients): the sink's ``--token``
sees it. An allow-list, so a count added to the overview later stays the operator's."""
SCOPED_ADMISSION = ("max_open", "per_experiment", "per_client")
"""What of admission a scoped token sees: the limits its runs are held to, not who holds runs."""
OTHER_SCOPE = "another scope"
"""How a scoped token's answers name a scope not its own (a run created under an older tokens file)."""


def _outside(scope: Scope, experiment_id: str) -> Refusal | None:
    if scope.allows(experiment_id):
        return None
    return Refusal(Kind.NOT_FOUND, f"no experiment {experiment_id[:200]!r} in {scope.label}")


class ScopedQueries:
    """What a scoped token may read: its scope's experiments only, and nothing that names another's."""

    def __init__(self, queries: ControlQueries, scope: Scope) -> None:
        self._queries = queries
        self._scope = scope

    def health(self) -> tuple[bool, list[str]]:
        return self._queries.health()

    def overview(self, scope: Scope = ALL) -> dict[str, Any]:
        """The overview as this token's scope sees it (``scope`` is ignored: it is always the token's)."""
        found = self._queries.overview(self._scope)
        seen = {key: found[key] for key in SCOPED_OVERVIEW if key in found}
        listed = seen.get("experiment_list")
        if isinstance(listed, list):  # the sink listed the scope's runs; this holds whatever it listed
            seen["experiment_list"] = [e for e in listed if self._scope.allows(str(e.get("id", "")))]
        admission = found.get("admission")
        if isinstance(admission, dict):
            seen["admission"] = {key: admission[key] for key in SCOPED_ADMISSION if key in admission}
        return {"scope": self._scope.name, **seen}

    def status(self, experiment_id: str, run: str | None = None) -> dict[str, Any] | None:
        if _outside(self._scope, experiment_id):
            return None
        found = self._queries.status(experiment_id, run)
        return None if found is None else _own_names(found, self._scope)

    def recent(self, experiment_id: str, run: str | None = None) -> list[dict[str, Any]] | None:
        return None if _outside(self._scope, experiment_id) else self._queries.recent(experiment_id, run)

    def span_rows(self, query: SpanQuery) -> Iterator[str] | None:
        return None if _outside(self._scope, query.experiment) else self._queries.span_rows(query)

    def capture_target(self, experiment_id: str, capture_id: str, process_id: str, size: int) -> Path:
        missing = _outside(self._scope, experiment_id)
        if missing:
            raise LookupError(missing)
        return self._queries.capture_target(experiment_id, capture_id, process_id, size)


def _own_names(status: dict[str, Any], scope: Scope) -> dict[str, Any]:
    """A run's status with every scope but ``scope`` and the sink's all-experiments one named
    ``OTHER_SCOPE`` (its runs' owners, the client that opened it); a copy: the sink's is kept."""
    known = ("", scope.name)
    runs = status.get("runs")
    found = dict(status)
    if isinstance(runs, list):
        found["runs"] = [
            {**r, "scope": OTHER_SCOPE} if isinstance(r, dict) and r.get("scope", "") not in known else r for r in runs
        ]
    client = found.get("client")
    if isinstance(client, str) and client.startswith("scope ") and client != Client(scope=scope).quota_key:
        found["client"] = OTHER_SCOPE
    return found


class ScopedCommands:
    """What a scoped token may do: within its scope's experiments only."""

    def __init__(self, commands: ControlCommands, scope: Scope) -> None:
        self._commands = commands
        self._scope = scope

    def configure(self, experiment_id: str, backends: Mapping[str, Mapping[str, Any]]) -> str:
        if not self._scope.allows(experiment_id):
            return f"refused: {self._scope.label} may not write experiment {experiment_id[:200]!r}"
        return self._commands.configure(experiment_id, backends)

    def report(self, experiment_id: str, timeout: float = 60.0, run: str | None = None) -> list[str] | Refusal:
        return _outside(self._scope, experiment_id) or self._commands.report(experiment_id, timeout, run)

    def capture(
        self,
        experiment_id: str,
        reason: str,
        steps: int,
        ranks: frozenset[int] | None = None,
        run: str | None = None,
    ) -> dict[str, Any] | Refusal:
        missing = _outside(self._scope, experiment_id)
        return missing or self._commands.capture(experiment_id, reason, steps, ranks, run)

    def pending_captures(self, experiment_id: str, process_id: str) -> list[dict[str, Any]]:
        if _outside(self._scope, experiment_id):
            return []
        return self._commands.pending_captures(experiment_id, process_id)

    def store_capture(self, experiment_id: str, capture_id: str, process_id: str, data: bytes) -> str:
        missing = _outside(self._scope, experiment_id)
        if missing:
            raise LookupError(missing)
        return self._commands.store_capture(experiment_id, capture_id, process_id, data)


MAX_CONFIG_DEPTH = 16
"""Levels of objects and lists a posted view config may nest (a view's options are a few deep)."""
MAX_RANK = 2**31
"""Ranks a capture may name are below this (a rank is a non-negative int32, as on the wire)."""


def _json(body: bytes) -> Any:
    """A JSON body; ``ValueError`` for one that does not parse, nested past the parser's depth too."""
    try:
        return json.loads(body)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def _deeper(value: Any, limit: int) -> bool:
    """Whether ``value`` nests objects and lists more than ``limit`` levels (walked without recursion)."""
    stack = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth >= limit:
                return True
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return False


def _run(query: dict[str, list[str]]) -> str | None:
    """The ``run`` a route asks for; absent: the experiment's latest run."""
    return query.get("run", [None])[0]
