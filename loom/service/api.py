"""The REST API: FastAPI routes over the store; the scheduling loop picks up what they write.

Every route reads or writes the store (the source of truth) and returns at once: a submission is
acknowledged when its row is committed, a cancel when the request is recorded; the engine thread
(`loom.service.engine`) takes both from the store on its next turn, woken by `Service.wake`.

Errors a client can cause are 4xx with a body naming the field (`ErrorBody`); anything else is a
500 whose body says only that it was logged, never a traceback. A tenant sees only its own jobs:
another tenant's job is "not found", so ids cannot be probed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from loom.errors import LoomInputError
from loom.service.auth import ApiError, Caller, Who
from loom.service.explain import explain_job, node_views
from loom.service.limits import BodyLimit
from loom.service.schemas import (
    ErrorBody,
    Explanation,
    Health,
    JobList,
    JobSubmission,
    JobView,
    NodeList,
    PolicyUpdate,
    PolicyView,
    TenantCreate,
    TenantToken,
)
from loom.service.views import job_view

log = logging.getLogger("loom.service")
ACTIVE = ("SUBMITTED", "ANNOUNCED", "PENDING", "STARTING", "RUNNING", "STOPPING", "SUSPENDED", "RECOVERING")
MAX_SEQ = 2**62  # sequence numbers fit a signed 64-bit column
ERRORS = {400: {"model": ErrorBody}, 401: {"model": ErrorBody}, 403: {"model": ErrorBody},
          404: {"model": ErrorBody}, 409: {"model": ErrorBody}, 413: {"model": ErrorBody},
          422: {"model": ErrorBody}}


def create_app(service: Any, *, max_body_bytes: int = 64 * 1024) -> FastAPI:
    """The application for `service` (a `loom.service.service.Service`: `store`, `wake()`,
    `metrics`, `info`)."""
    from loom import __version__

    app = FastAPI(title="Loom", version=__version__, responses=ERRORS,  # type: ignore[arg-type]
                  description="Loom's live scheduler: submit, watch, explain and cancel jobs.")
    app.state.service = service
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    _errors(app)
    @app.get("/healthz", response_model=Health, tags=["service"])
    def healthz() -> Health:
        return Health(version=__version__, backend=service.info.get("backend"), policy=service.info.get("policy"))

    @app.post("/v1/jobs", response_model=JobView, status_code=201, tags=["jobs"])
    def submit(job: JobSubmission, who: Who,
               idempotency_key: Annotated[str | None, Header(max_length=128)] = None) -> JobView:
        try:
            row = service.store.submit(who.tenant, job.spec(), idempotency_key=idempotency_key)
        except LoomInputError as exc:
            raise ApiError(409 if exc.field == "job_id" else 422, exc.message, exc.field) from None
        service.metrics.submitted(job.job_class.value)
        service.wake()
        return job_view(row)

    @app.get("/v1/jobs", response_model=JobList, tags=["jobs"])
    def jobs(who: Who, state: Annotated[list[str] | None, Query(max_length=16)] = None,
             all: bool = False, limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
             after: Annotated[str | None, Query(max_length=64)] = None) -> JobList:
        """The queue and running jobs (or every job with `all=true`, or those in `state`), oldest first."""
        states = [s.upper() for s in state] if state else (None if all else list(ACTIVE))
        rows = service.store.jobs(tenant=who.scope, states=states, limit=limit, after=after)
        return JobList(jobs=[job_view(r) for r in rows])

    @app.get("/v1/jobs/{job_id}", response_model=JobView, tags=["jobs"])
    def status(job_id: str, who: Who) -> JobView:
        return job_view(_own_job(service, who, job_id))

    @app.post("/v1/jobs/{job_id}/cancel", response_model=JobView, tags=["jobs"])
    def cancel(job_id: str, who: Who) -> JobView:
        _own_job(service, who, job_id)
        row = service.store.request_cancel(job_id, who.scope)
        if row is None:
            raise ApiError(404, f"no job '{job_id}'", "job_id")
        service.wake()
        return job_view(row)

    @app.get("/v1/jobs/{job_id}/explain", response_model=Explanation, tags=["jobs"])
    def explain(job_id: str, who: Who) -> Explanation:
        return explain_job(service.store, _own_job(service, who, job_id))

    @app.get("/v1/nodes", response_model=NodeList, tags=["nodes"])
    def nodes(who: Who) -> NodeList:
        return node_views(service.store)

    @app.get("/v1/events", tags=["events"], response_class=StreamingResponse,
             responses={200: {"content": {"text/event-stream": {}}}})
    async def events(request: Request, who: Who, after: Annotated[int, Query(ge=0, le=MAX_SEQ)] = 0,
                     follow: bool = True, last_event_id: Annotated[str | None, Header()] = None) -> Response:
        """Server-sent events: every submission, transition, decision and answer the caller may see,
        from `after` (or the `Last-Event-ID` header) on; `follow=false` sends what exists and ends."""
        start = int(last_event_id) if last_event_id and last_event_id.isdigit() else after
        if start > MAX_SEQ:
            raise ApiError(422, f"must be at most {MAX_SEQ}", "last-event-id")
        stream = _event_stream(request, service, who.scope, start, follow)
        return StreamingResponse(stream, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.post("/v1/tenants", response_model=TenantToken, status_code=201, tags=["admin"])
    def create_tenant(body: TenantCreate, who: Who) -> TenantToken:
        who.require_admin()
        try:
            tenant, token = service.store.create_tenant(body.name, admin=body.admin)
        except LoomInputError as exc:
            raise ApiError(409, exc.message, "name") from None
        return TenantToken(tenant=tenant.name, admin=tenant.admin, token=token)

    @app.post("/v1/nodes/{name}/drain", response_model=NodeList, tags=["admin"])
    def drain(name: str, who: Who) -> NodeList:
        """Admin: nothing new is placed on the node; what runs there goes on until it ends."""
        return _node_operation(service, who, name, "drain_node")

    @app.post("/v1/nodes/{name}/undrain", response_model=NodeList, tags=["admin"])
    def undrain(name: str, who: Who) -> NodeList:
        """Admin: a drained node takes new work again."""
        return _node_operation(service, who, name, "undrain_node")

    @app.get("/v1/policy", response_model=PolicyView, tags=["admin"])
    def policy(who: Who) -> PolicyView:
        """Admin: the policy and placer in use, the round interval, whether scheduling is paused."""
        who.require_admin()
        return _policy_view(service)

    @app.patch("/v1/policy", response_model=PolicyView, tags=["admin"])
    def update_policy(body: PolicyUpdate, who: Who) -> PolicyView:
        """Admin: pause or resume scheduling (e.g. for maintenance), change the round interval."""
        who.require_admin()
        engine = service.engine
        if engine is None:
            raise ApiError(409, "no scheduling engine runs in this process", "policy")

        def apply(_core: Any) -> None:
            if body.round_interval is not None:
                engine.round_interval = body.round_interval
            if body.paused is not None:
                engine.paused = body.paused
            engine.wake()

        engine.call(apply).result(timeout=30)
        return _policy_view(service)

    @app.get("/metrics", tags=["service"], response_class=Response,
             responses={200: {"content": {"text/plain": {}}}})
    def metrics() -> Response:
        body, content_type = service.metrics.exposition(service.store)
        return Response(body, media_type=content_type)

    from loom.service import dashboard

    dashboard.install(app, service)
    return app


def _policy_view(service: Any) -> PolicyView:
    engine = service.engine
    return PolicyView(policy=service.info.get("policy") or "", placer=service.info.get("placer") or "",
                      round_interval=getattr(engine, "round_interval", None),
                      paused=bool(getattr(engine, "paused", False)))


def _node_operation(service: Any, who: Caller, name: str, operation: str) -> NodeList:
    who.require_admin()
    names = {n.name for n in node_views(service.store).nodes}
    if name not in names:
        raise ApiError(404, f"no node '{name[:128]}'", "name")
    act = getattr(getattr(service, "backend", None), operation, None)
    if act is None:
        raise ApiError(409, f"the {service.info.get('backend')} backend cannot {operation.split('_')[0]} nodes", "name")
    act(name)
    engine = service.engine
    if engine is not None:  # the engine has seen the node event (and the store has it) when this returns
        engine.call(lambda core: None).result(timeout=30)
        engine.call(lambda core: None).result(timeout=30)
    return node_views(service.store)


def _own_job(service: Any, who: Caller, job_id: str) -> Any:
    row = service.store.job(job_id) if len(job_id) <= 128 else None
    if row is None or (who.scope is not None and row.tenant != who.scope):
        raise ApiError(404, f"no job '{job_id[:128]}'", "job_id")
    return row


async def _event_stream(request: Request, service: Any, tenant: str | None, after: int,
                        follow: bool) -> AsyncIterator[bytes]:
    seq, idle = after, 0.0
    while True:
        rows = await asyncio.to_thread(service.store.events_after, seq, tenant=tenant, limit=500)
        for row in rows:
            seq = row.seq
            data = json.dumps({"seq": row.seq, "at": row.at, "kind": row.kind, "job_id": row.job_id,
                               "data": row.data or {}})
            yield f"id: {row.seq}\nevent: {row.kind}\ndata: {data}\n\n".encode()
        if rows and len(rows) == 500:
            continue
        if not follow or await request.is_disconnected():
            return
        idle += 0.5
        if idle >= 15.0:
            idle = 0.0
            yield b": keep-alive\n\n"
        await asyncio.sleep(0.5)


def _errors(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        problems = [{"field": exc.field, "message": exc.message}] if exc.field else []
        return JSONResponse({"error": exc.message, "problems": problems}, status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        field = "body" if exc.status_code in (400, 413) else "path" if exc.status_code in (404, 405) else "request"
        message = str(exc.detail)
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:  # Starlette names only the first matching route's methods
            headers["Allow"] = ", ".join(_allowed(request))
        return JSONResponse({"error": message, "problems": [{"field": field, "message": message}]},
                            status_code=exc.status_code, headers=headers or None)

    @app.exception_handler(LoomInputError)
    async def bad_input(request: Request, exc: LoomInputError) -> JSONResponse:
        field = exc.field or "request"
        return JSONResponse({"error": exc.located(), "problems": [{"field": field, "message": exc.message}]},
                            status_code=422)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [{"field": _field(e.get("loc", ())), "message": _message(e)} for e in exc.errors()]
        first = problems[0] if problems else {"field": "body", "message": "invalid request"}
        text = f"{first['field']}: {first['message']}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
        return JSONResponse({"error": text, "problems": problems}, status_code=422)

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        incident = uuid.uuid4().hex[:12]
        log.exception("internal error %s on %s %s", incident, request.method, request.url.path)
        return JSONResponse({"error": f"internal error; logged as {incident}", "problems": []}, status_code=500)


def _allowed(request: Request) -> list[str]:
    """Every method some route serves at this path."""
    from starlette.routing import Match

    methods: set[str] = set()
    for route in request.app.routes:
        match, _ = route.matches({**request.scope, "method": "GET"})
        if match is not Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
        for method in ("POST", "PUT", "PATCH", "DELETE"):
            if route.matches({**request.scope, "method": method})[0] is Match.FULL:
                methods.add(method)
    return sorted(methods)


def _field(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or (str(loc[0]) if loc else "body")


def _message(error: dict[str, Any]) -> str:
    message = str(error.get("msg", "invalid"))
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    if error.get("type") == "extra_forbidden":
        return "unknown field (check its spelling)"
    return message
