"""The app factory: builds the FastAPI app from Settings, wiring routers and background jobs."""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import Depends, FastAPI, Request, status
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from sqlalchemy import Engine
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from service import __version__
from service.actions.registry import check_action_webhook_url
from service.api.deps import ApiState, session_key
from service.api.gate import Admission, FailFast, TokenGate
from service.api.input_guard import BodyBudget, RequestGuard
from service.api.oidc import OidcClient, OidcConfig
from service.api.openapi import install_openapi
from service.api.outage import OUTAGE_ERRORS, database_unavailable, request_outage_log
from service.api.query import reject_unknown_query
from service.api.reads import NoteWrites
from service.api.routers import actions as actions_router
from service.api.routers import (
    alerts,
    changes,
    channels,
    console,
    fleet,
    gpus,
    health,
    ingest,
    notices,
    owners,
    policies,
    session,
    silences,
)
from service.api.routers import jobs as jobs_router
from service.api.routers import oidc as oidc_router
from service.api.routers import periodic_reports as periodic_router
from service.api.routers import prices as prices_router
from service.api.routers import reports as reports_router
from service.api.routers import savings as savings_router
from service.api.routers import unsubscribe as unsubscribe_router
from service.api.timing import ServerTiming
from service.api.validation import request_validation_error
from service.clock import Clock, utc_now
from service.context import ServiceContext
from service.db import foreground
from service.db.engine import ingest_engine, read_engine, service_engine
from service.db.migrate import check_at_head
from service.errors import (
    Conflict,
    Forbidden,
    NotFound,
    Unavailable,
    ValidationFailed,
    WardenError,
)
from service.reads import ReadRouter
from service.scheduler import start_scheduler
from service.settings import Settings
from service.telemetry import Telemetry
from service.usecases.costing.day_sums import today_lag_seconds
from service.usecases.evaluation import load_config as load_alerting_config
from service.usecases.fleet import WastedTodayCache
from service.usecases.upkeep import partitions_once

log = logging.getLogger(__name__)

_STATUS: list[tuple[type[WardenError], int]] = [
    (ValidationFailed, status.HTTP_422_UNPROCESSABLE_CONTENT),
    (NotFound, status.HTTP_404_NOT_FOUND),
    (Conflict, status.HTTP_409_CONFLICT),
    (Forbidden, status.HTTP_403_FORBIDDEN),
    (Unavailable, status.HTTP_503_SERVICE_UNAVAILABLE),
]


async def _warden_error(_: Request, exc: Exception) -> JSONResponse:
    for cls, code in _STATUS:
        if isinstance(exc, cls):
            if isinstance(exc, ValidationFailed):
                loc = ["body", *(int(p) if p.isdigit() else p for p in exc.field.split("."))]
                detail: object = [{"loc": loc, "msg": exc.message, "type": "value_error"}]
            else:
                detail = str(exc)
            headers = None
            if isinstance(exc, Unavailable):
                headers = {"Retry-After": str(exc.retry_after_seconds)}
            return JSONResponse({"detail": detail}, status_code=code, headers=headers)
    return JSONResponse({"detail": str(exc)}, status_code=status.HTTP_400_BAD_REQUEST)


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
# Rollup intervals after a fleet page's last look during which the background job keeps the
# fleet's dollars read ahead where no sums answer them (a console looking every minute or so).
FLEET_WATCHED_INTERVALS = 8


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's HTTP errors as usual, but a 405's Allow lists every method of the path.

    The router answers 405 from the first route matching the path alone, which lists only that
    route's methods when a path has several (GET and PATCH of a job are two routes).
    """
    assert isinstance(exc, StarletteHTTPException)
    if (
        exc.status_code == status.HTTP_404_NOT_FOUND
        and request.method in ("GET", "HEAD")
        and request.scope.get("route") is None
        and console.is_console_path(request.url.path)
    ):
        return console.not_found_page()
    if exc.status_code == status.HTTP_405_METHOD_NOT_ALLOWED:
        allowed = [
            method
            for method in _METHODS
            if any(
                route.matches({**request.scope, "method": method})[0] is Match.FULL
                for route in request.app.router.routes
            )
        ]
        exc.headers = {**(exc.headers or {}), "Allow": ", ".join(allowed)}
    return await http_exception_handler(request, exc)


def freeze_start_up_objects() -> None:
    """Move every object built so far out of the cyclic GC's full collections.

    Modules, the app and the engine live as long as the process; without this each full
    collection walks them again (about half the GC time of a 5,000-job cost report). Call it
    once the app is built, right before serving.
    """
    gc.freeze()


def _service_context(
    settings: Settings, engine: Engine | None, clock: Clock, telemetry: Telemetry | None
) -> ServiceContext:
    """The ServiceContext of the app: its engines (main, ingest, read replica), clock, telemetry."""
    main_engine = engine or service_engine(settings)
    # Background rounds pause at their statements while an API read runs in this process.
    foreground.give_way_at_statements(main_engine)
    # Agents are the lifeline: their batches (and token lookups) get connections reads cannot take.
    ingest_pool = ingest_engine(settings, main_engine.url.render_as_string(hide_password=False))
    ctx = ServiceContext(
        settings=settings,
        engine=main_engine,
        ingest_engine=ingest_pool,
        clock=clock,
        telemetry=telemetry or Telemetry(),
    )
    if settings.database_read_url is not None:
        replica = read_engine(settings, settings.database_read_url)
        foreground.give_way_at_statements(replica)
        ctx.read_router = ReadRouter(
            primary=main_engine,
            replica=replica,
            telemetry=ctx.telemetry,
            max_lag_seconds=settings.database_read_max_lag_seconds,
            check_seconds=settings.database_read_check_seconds,
        )
    return ctx


def _lifespan(
    ctx: ServiceContext, *, fleet_cache: WastedTodayCache, dispose_engine: bool
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Startup (schema check, partitions, config file, session key, scheduler) and shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        check_at_head(ctx.engine)
        partitions_once(ctx)
        load_alerting_config(ctx)  # policies and channels of the YAML file
        check_action_webhook_url(ctx.settings)  # as channel URLs are: refused addresses stop here
        session_key(ctx)  # made at the first start, so every replica reads the same one
        scheduler = None
        if ctx.settings.run_scheduler:
            scheduler = start_scheduler(ctx, fleet_cache=fleet_cache)
        try:
            yield
        finally:
            if scheduler is not None:
                scheduler.shutdown(wait=True)
            for hook in ctx.shutdown_hooks:
                hook()
            if ctx.ingest_engine is not None:
                ctx.ingest_engine.dispose()
            if ctx.reads.replica is not None:
                ctx.reads.replica.dispose()
            if dispose_engine:
                ctx.engine.dispose()

    return lifespan


def _api_state(ctx: ServiceContext) -> ApiState:
    """The app's runtime state around ``ctx``: token gate, admission, budgets, caches."""
    settings = ctx.settings
    return ApiState(
        ctx=ctx,
        outage_log=request_outage_log(),
        gate=TokenGate(settings),
        # The fleet page's dollars move only as rollups run, or as today's sums are written.
        fleet_cache=WastedTodayCache(
            max_age_seconds=settings.rollup_interval_seconds,
            sums_lag_seconds=today_lag_seconds(settings),
            watched_seconds=FLEET_WATCHED_INTERVALS * settings.rollup_interval_seconds,
        ),
        admission=Admission(settings),
        body_budget=BodyBudget(settings.body_memory_budget_bytes),
        oidc=None if (oidc := OidcConfig.from_settings(settings)) is None else OidcClient(oidc),
    )


def _add_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(WardenError, _warden_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, request_validation_error)
    for error in OUTAGE_ERRORS:
        app.add_exception_handler(error, database_unavailable)


def _add_middleware(app: FastAPI, state: ApiState) -> None:
    app.add_middleware(RequestGuard, settings=state.ctx.settings, budget=state.body_budget)
    app.add_middleware(NoteWrites, reads=state.ctx.reads)
    # Added last, so it runs first: a throttled client's refusal costs no parsing or routing.
    app.add_middleware(FailFast, gate=state.gate)
    # Outermost: the time it reports covers everything the service does for the request.
    app.add_middleware(ServerTiming)


def _include_routers(app: FastAPI) -> None:
    app.include_router(health.router)
    app.include_router(ingest.router, prefix="/api/v1")
    app.include_router(gpus.router, prefix="/api/v1")
    app.include_router(fleet.router, prefix="/api/v1")
    for module in (policies, channels, silences, alerts, owners, notices, changes):
        app.include_router(module.router, prefix="/api/v1")
    app.include_router(jobs_router.router, prefix="/api/v1")
    app.include_router(jobs_router.verdicts, prefix="/api/v1")
    app.include_router(prices_router.router, prefix="/api/v1")
    app.include_router(reports_router.router, prefix="/api/v1")
    app.include_router(savings_router.router, prefix="/api/v1")
    app.include_router(periodic_router.router, prefix="/api/v1")
    app.include_router(unsubscribe_router.router)
    app.include_router(actions_router.router, prefix="/api/v1")
    app.include_router(session.router, prefix="/api/v1")
    app.include_router(oidc_router.router, prefix="/api/v1")
    app.include_router(console.router)
    app.mount(console.STATIC_PREFIX, StaticFiles(directory=console.STATIC_DIR), name="static")


def create_app(
    settings: Settings | None = None,
    *,
    engine: Engine | None = None,
    clock: Clock = utc_now,
    telemetry: Telemetry | None = None,
) -> FastAPI:
    """Build the central service; it checks the schema and starts background jobs on startup."""
    settings = settings or Settings()
    ctx = _service_context(settings, engine, clock, telemetry)
    state = _api_state(ctx)
    app = FastAPI(
        title="GPU Warden",
        version=__version__,
        summary="GPU telemetry, idle-GPU alerting and wasted-spend reports",
        lifespan=_lifespan(ctx, fleet_cache=state.fleet_cache, dispose_engine=engine is None),
        dependencies=[Depends(reject_unknown_query)],
        # Served by the console router from the package's own copies, never from a CDN.
        docs_url=None,
        redoc_url=None,
    )
    app.state = state
    _add_error_handlers(app)
    _add_middleware(app, state)
    _include_routers(app)
    install_openapi(app)
    return app
