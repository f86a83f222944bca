"""REST status API (FastAPI, OpenAPI at /docs) and /metrics. Routes are short adapters;
refusals become problem JSON (RFC 9457) in one handler."""

from __future__ import annotations

import hmac
from pathlib import Path as FilePath
from typing import Annotated

from fastapi import Depends, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from pydantic import BaseModel
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from controller.core.checks import ID_PATTERN
from controller.core.commands import Cordon, Drain, Uncordon
from controller.core.diagnosis.findings import FindingKind
from controller.core.errors import RequestError
from controller.core.view import ControllerView
from controller.service.errors import NotLeader, http_status
from controller.service.event_log import iso_time
from controller.service.paging import PAGE_MAX, SortedIds, event_page, host_page, next_link
from controller.service.stall_schema import StallsView
from controller.service.telemetry_wire import entry_view
from controller.service.views import host_reasons, host_view, job_view, quorum_view, replica_rows, stalls_view
from controller.store import StoreError

PROBLEM = "application/problem+json"
#: The status page: HTML, JS and CSS shipped in the package (no CDN). Swagger UI and ReDoc
#: come from the fastapi-offline package's files, served under /ui/vendor.
UI_DIR = FilePath(__file__).parent / "ui"
#: The pages may load only what this controller serves: an air-gapped cluster's browser never
#: tries a CDN (ReDoc would fetch its logo from one). Swagger UI starts from an inline script.
PAGE_POLICIES = {
    "/ui": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "/docs": "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
             "img-src 'self' data:; frame-ancestors 'none'",
    "/redoc": "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
              "worker-src 'self' blob:; font-src 'self' data:; frame-ancestors 'none'",
}
#: The largest page of findings one request gets.
MAX_PAGE = 500


class Problem(BaseModel):
    """An HTTP problem (RFC 9457)."""

    type: str
    title: str
    status: int
    detail: str


def _problems(*codes: int) -> dict:
    return {code: {"model": Problem, "content": {PROBLEM: {}}} for code in codes}


READ_PROBLEMS = _problems(401, 403, 422, 503)
ADMIN_PROBLEMS = _problems(400, 401, 403, 404, 409, 422, 503)
HostId = Annotated[str, Path(pattern=ID_PATTERN, max_length=128, description="the host's id")]


class Unauthorized(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


def problem(status: int, title: str, detail: str) -> JSONResponse:
    return JSONResponse({"type": "about:blank", "title": title, "status": status, "detail": detail},
                        status_code=status, media_type=PROBLEM)


def _check_token(expected: str | None, authorization: str | None, what: str) -> None:
    if expected is None:
        raise Unauthorized(403, f"the {what} API is disabled: this controller has no token configured")
    if not authorization or not authorization.startswith("Bearer "):
        raise Unauthorized(401, f"the {what} API needs an 'Authorization: Bearer <token>' header")
    if not hmac.compare_digest(authorization[7:].encode(), expected.encode()):
        raise Unauthorized(403, f"the bearer token is not valid for the {what} API")


def get_server(request: Request):
    return request.app.state.server


async def read_access(request: Request, authorization: Annotated[str | None, Header()] = None):
    srv = get_server(request)
    if srv.read_token is not None:
        _check_token(srv.read_token, authorization, "read")
    return srv


async def admin_access(request: Request, authorization: Annotated[str | None, Header()] = None):
    srv = get_server(request)
    _check_token(srv.admin_token, authorization, "admin")
    return srv.require_leader()


async def view(srv: Annotated[object, Depends(read_access)]) -> tuple:
    """The leader's live state, or on a standby the last durable snapshot."""
    if srv.leading and srv.state is not None:
        return srv.state, srv
    return (await srv.load_core()).view, srv


View = Annotated[tuple, Depends(view)]
Admin = Annotated[ControllerView, Depends(admin_access)]


def make_app(server) -> FastAPI:
    app = FastAPIOffline(title="fthsdp controller", version="1", static_url="/ui/vendor",
                         description="Status and administration of a fault-tolerant HSDP job. "
                                     "The status page is at /ui.")
    app.state.server = server
    app.mount("/ui/assets", StaticFiles(directory=UI_DIR), name="ui-assets")

    _add_pages_and_problems(app)
    _add_status_routes(app)
    _add_history_routes(app)
    _add_admin_routes(app, server)
    return app


def _add_pages_and_problems(app: FastAPI) -> None:
    """The status page, its security headers, and errors as HTTP problems."""
    @app.middleware("http")
    async def page_policy(request: Request, call_next):
        response = await call_next(request)
        policy = PAGE_POLICIES.get(request.url.path)
        if policy is not None:
            response.headers["Content-Security-Policy"] = policy
        return response

    @app.get("/", include_in_schema=False)
    async def root():
        return RedirectResponse("/ui")

    @app.get("/ui", include_in_schema=False)
    async def ui():
        return FileResponse(UI_DIR / "index.html", media_type="text/html")

    @app.exception_handler(RequestError)
    @app.exception_handler(NotLeader)
    @app.exception_handler(StoreError)
    async def refused(request: Request, exc: Exception):
        return problem(http_status(exc) or 500, type(exc).__name__, str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        details = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        return problem(422, "Unprocessable request", details)

    @app.exception_handler(Unauthorized)
    async def unauthorized(request: Request, exc: Unauthorized):
        return problem(exc.status, "Unauthorized" if exc.status == 401 else "Forbidden", str(exc))


def _add_status_routes(app: FastAPI) -> None:
    """What the job is now: its summary, replicas, hosts, stalls, quorums (read access)."""
    @app.get("/api/v1/job", responses=READ_PROBLEMS, summary="Job summary: replicas, quorum, spares")
    async def job(v: View):
        state, srv = v
        return job_view(state, await srv.store.leader() or "", srv.leading, srv.clock())

    @app.get("/api/v1/replicas", responses=READ_PROBLEMS, summary="Every replica with its state and the reason for it")
    async def replicas(v: View):
        state, srv = v
        return replica_rows(state, srv.clock())

    host_index = SortedIds()

    @app.get("/api/v1/hosts", responses=READ_PROBLEMS,
             summary=f"Hosts, the spare pool and cordons, by id; pages of at most {PAGE_MAX} (Link: rel=next)")
    async def hosts(v: View, response: Response,
                    limit: Annotated[int, Query(ge=1, le=PAGE_MAX)] = PAGE_MAX,
                    after: Annotated[str, Query(max_length=128, description="the last host id of the previous page")] = ""):
        state, srv = v
        now = srv.clock()
        page, cursor = host_page(host_index.of(state), after, limit)
        if cursor is not None:
            response.headers["Link"] = next_link("/api/v1/hosts", limit=limit, after=cursor)
        reasons = host_reasons(state)
        return [host_view(state.hosts[h], now, reasons) for h in page]

    @app.get("/api/v1/stalls", responses=READ_PROBLEMS, response_model=StallsView,
             summary="When the job stood still (its committed step did not advance), and the failures behind it")
    async def stalls(v: View):
        state, srv = v
        return stalls_view(state, srv.clock())

    @app.get("/api/v1/quorums", responses=READ_PROBLEMS, summary="The current quorum and recent ones, each with its reason")
    async def quorums(v: View):
        state, _ = v
        return {"current": quorum_view(state.quorum), "round_reason": state.round_reason,
                "recent": [quorum_view(q) for q in reversed(state.quorum_history)]}


def _add_history_routes(app: FastAPI) -> None:
    """What happened: events, goodput history, the diagnoses (read access)."""
    @app.get("/api/v1/events", responses=READ_PROBLEMS,
             summary=f"Recent state changes, newest last; each has a seq, pages of at most {PAGE_MAX} events")
    async def events(v: View, response: Response,
                     limit: Annotated[int, Query(ge=1, le=100_000, description=f"served as at most {PAGE_MAX}")] = 200,
                     after: Annotated[int | None, Query(ge=-1, description="the last seq seen: the events after it, oldest first")] = None):
        state, _ = v
        page, cursor = event_page(state.events, after, limit)
        if cursor is not None:
            response.headers["Link"] = next_link("/api/v1/events", limit=min(limit, PAGE_MAX), after=cursor)
        return [{**e.__dict__, "ts": iso_time(e.at)} for e in page]  # ts: as the JSON event log writes it

    @app.get("/api/v1/history", responses=READ_PROBLEMS,
             summary="Chart samples of the job: [time, committed step, healthy replicas], oldest first")
    async def history(v: View, limit: Annotated[int, Query(ge=1, le=10_000)] = 720):
        state, _ = v
        return [list(sample) for sample in list(state.goodput.history)[-limit:]]

    @app.get("/api/v1/diagnoses", responses=READ_PROBLEMS,
             summary="Findings of the diagnosis (hangs, stragglers, SDC), newest first, with what was done")
    async def diagnoses(v: View, limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
                        before_id: Annotated[int | None, Query(ge=1, description="page: ids below this")] = None,
                        kind: Annotated[FindingKind | None, Query()] = None):
        state, _ = v
        log = state.diagnosis.log
        page = log.page(limit, before_id, kind.value if kind else None)
        return {"findings": [entry_view(e) for e in page],
                "next_before_id": page[-1].id if len(page) == limit else None,
                "findings_by_kind": dict(log.findings_by_kind), "actions_by_kind": dict(log.actions_by_kind),
                "dry_run": state.settings.diagnosis.dry_run, "enabled": state.settings.diagnosis.enabled}


def _add_admin_routes(app: FastAPI, server) -> None:
    """Operator actions (admin token), metrics and liveness."""
    @app.post("/api/v1/hosts/{host_id}/drain", responses=ADMIN_PROBLEMS, summary="Move a host's work to a spare, then stop it (admin)")
    async def drain(host_id: HostId, state: Admin):
        message = await server.apply(Drain(host_id))
        return {"host_id": host_id, "result": message}

    @app.post("/api/v1/hosts/{host_id}/cordon", responses=ADMIN_PROBLEMS, summary="Keep a host out of the spare pool (admin)")
    async def cordon(host_id: HostId, state: Admin, reason: Annotated[str, Query(max_length=512)] = ""):
        await server.apply(Cordon(host_id, reason))
        return {"host_id": host_id, "cordoned": True}

    @app.post("/api/v1/hosts/{host_id}/uncordon", responses=ADMIN_PROBLEMS, summary="Return a host to service (admin)")
    async def uncordon(host_id: HostId, state: Admin):
        await server.apply(Uncordon(host_id))
        return {"host_id": host_id, "cordoned": False}

    @app.get("/metrics", include_in_schema=False)
    async def metrics(_: Annotated[object, Depends(read_access)]):  # the read token, when one is set
        return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", summary="Liveness of this controller process")
    async def healthz():
        return {"ok": True, "leading": server.leading}
