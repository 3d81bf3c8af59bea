"""``/api/v1/jobs``: register, update, end, get (with its waste summary) and list jobs."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import ValidationError as PydanticValidationError
from sqlalchemy import Connection

from service.api import authz, query
from service.api.deps import (
    Agent,
    Authenticated,
    Ctx,
    Expensive,
    ReadConn,
    Scope,
    require,
    visible_job,
)
from service.api.schemas.costs import (
    JobCreate,
    JobDetailPublic,
    JobListItemPublic,
    JobPublic,
    JobUpdate,
    OddGpuPublic,
)
from service.api.schemas.progress import (
    JobProgressPublic,
    ProgressAccepted,
    ProgressCreate,
    ProgressSummaryPublic,
    ReadingPublic,
)
from service.context import ServiceContext
from service.core.progress import ProgressSummary, Reading
from service.costs.money import SORT_BYS
from service.db import job_runs_repo, jobs_repo
from service.db.rows import JobRow
from service.db.tokens_repo import TokenInfo
from service.errors import Conflict, NotFound, ValidationFailed
from service.roles import JobScope, Role
from service.usecases import job_list, progress, savings, useful_work
from service.usecases.job_summary import job_summary
from service.usecases.verdict import admin_comment

router = APIRouter(prefix="/jobs", tags=["jobs"])
# Not /jobs/{id}/verdict: a job id may hold "/" (k8s:<namespace>/<pod>), so that path would
# also read as the job "k8s:<namespace>" of a pod named "verdict".
verdicts = APIRouter(prefix="/verdicts", tags=["jobs"])
AgentOrReader = Annotated[TokenInfo, Depends(require(Role.READER, Role.AGENT, scoped=True))]
log = logging.getLogger(__name__)


def _start_window(ctx: ServiceContext) -> authz.StartWindow:
    return authz.StartWindow(
        max_age_seconds=ctx.settings.job_agent_max_start_age_seconds,
        max_future_seconds=ctx.settings.ingest_max_future_seconds,
    )


def _gpu_facts(conn: Connection, uuids: list[str]) -> list[authz.GpuFacts]:
    known = jobs_repo.known_gpus(conn, uuids=uuids)
    facts = []
    for i, uuid in enumerate(uuids):
        if uuid not in known:
            raise ValidationFailed(f"gpus.{i}", f"no GPU with uuid {uuid!r} is known")
        _, node, first_seen_at = known[uuid]
        facts.append(authz.GpuFacts(uuid=uuid, node=node, first_seen_at=first_seen_at))
    return facts


def _public(job: JobRow) -> JobPublic:
    return JobPublic.model_validate(_shown(job))


def _shown(job: JobRow) -> Mapping[str, Any]:
    """The job's fields as its public forms name them (its intervals are its ``gpus``)."""
    return {**job, "labels": job.get("labels") or {}, "gpus": job.get("intervals", [])}


def _record_claim(
    ctx: ServiceContext,
    conn: Connection,
    token: TokenInfo,
    existing: JobRow,
    claimed: dict[str, Any],
    exc: Conflict,
) -> Conflict:
    """Keep an agent's refused claim on ``existing`` for admins: a row on the job, an audit line
    and a count; returns the 409 to answer."""
    node = authz.agent_node(token) or "?"
    jobs_repo.record_conflict(
        conn, job_id=existing["id"], node=node, source="api", claimed=claimed, at=ctx.clock()
    )
    ctx.telemetry.job_conflicts.labels("api").inc()
    log.warning("%s", jobs_repo.conflict_line(existing, node=node, claimed=claimed, source="api"))
    return Conflict(f"{exc}; the conflict is recorded on the job for an admin to settle")


def _end_earlier_jobs(
    conn: Connection, body: JobCreate, now: datetime, only_node: str | None
) -> None:
    """End the jobs a job that holds its GPUs alone finds still open on them (missed ends);
    for an agent, only those its node registered."""
    ghosts = jobs_repo.end_earlier_jobs(
        conn, job_id=body.id, gpu_uuids=body.gpus, started_at=body.started_at, now=now,
        only_node=only_node,
    )  # fmt: skip
    if ghosts:
        log.warning(
            "job %s holds its GPUs alone from %s: ended %s, still open there (a missed end,"
            " such as a lost Slurm epilog)",
            body.id,
            body.started_at.isoformat(),
            ", ".join(ghosts),
        )


def _set_aside_ended_run(conn: Connection, body: JobCreate, now: datetime) -> None:
    """Move the ended record of ``body``'s id aside when ``body`` is a new run of that id (a
    wrapped Slurm id); a refusal later in the request rolls the move back."""
    moved = job_runs_repo.set_aside_ended_run(
        conn, job_id=body.id, started_at=body.started_at, now=now
    )
    if moved is not None:
        log.info(
            "job %s starts again at %s, after its last run ended: that run's record is now %s",
            body.id,
            body.started_at.isoformat(),
            moved,
        )


@router.post("", response_model=JobPublic, status_code=status.HTTP_201_CREATED)
def create_job(body: JobCreate, ctx: Ctx, token: Agent, response: Response) -> JobPublic:
    """Create a job, or merge into the job of that id (201 when new, 200 when merged)."""
    now = ctx.clock()
    fields = body.model_dump(include=set(authz.CREATION_FIELDS), exclude_unset=True)
    # Commit before answering, so a client that reads right after sees its write.
    with ctx.engine.begin() as conn:
        _set_aside_ended_run(conn, body, now)
        existing = jobs_repo.get_job(conn, job_id=body.id)
        try:
            authz.check_job_post(
                token,
                existing=existing,
                fields=fields,
                gpus=_gpu_facts(conn, body.gpus),
                started_at=body.started_at,
                now=now,
                window=_start_window(ctx),
            )
        except Conflict as exc:
            # Committed with the transaction, then answered 409: the claim itself is refused.
            assert existing is not None  # only a stored job's metadata can disagree
            refused: Conflict | None = _record_claim(ctx, conn, token, existing, fields, exc)
        else:
            refused = None
        if refused is None:
            created = jobs_repo.upsert_job(
                conn,
                job_id=body.id,
                fields=fields,
                gpu_uuids=body.gpus,
                started_at=body.started_at,
                ended_at=body.ended_at,
                now=now,
                only_node=authz.agent_node(token),
            )
            if body.exclusive:
                _end_earlier_jobs(conn, body, now, authz.agent_node(token))
            job = jobs_repo.get_job(conn, job_id=body.id)
    if refused is not None:
        raise refused
    if not created:
        response.status_code = status.HTTP_200_OK
    assert job is not None
    return _public(job)


# Before PATCH and GET /{job_id:path}, which would read ".../progress" as a job's id: a job
# whose own id ends in "/progress" (a pod named "progress") is found by the routes below when no
# job of the shorter id exists.
@router.post(
    "/{job_id:path}/progress", response_model=ProgressAccepted, status_code=status.HTTP_201_CREATED
)
def post_progress(
    job_id: str, body: ProgressCreate, ctx: Ctx, token: Agent, response: Response
) -> ProgressAccepted:
    """Record the job's running total of steps, samples or tokens (201; 200 for a repeat of the
    last reading): an agent token of a node that registered the job, or an admin; a unit change,
    a reading older than the last or a total below it is refused (409)."""
    now = ctx.clock()
    with ctx.engine.begin() as conn:
        job = jobs_repo.get_job(conn, job_id=job_id, for_update=True)
        if job is None:
            raise NotFound(f"job {job_id!r} does not exist")
        authz.check_job_rights(token, intervals=job["intervals"], field="progress")
        reading = Reading(at=body.at or now, unit=body.unit, value=body.value)
        stored = progress.record(
            conn,
            job_id=job_id,
            job_started_at=job["started_at"],
            reading=reading,
            now=now,
            max_future_seconds=ctx.settings.ingest_max_future_seconds,
        )
    if not stored:
        response.status_code = status.HTTP_200_OK
    return ProgressAccepted(
        job_id=job_id, at=reading.at, unit=reading.unit, value=reading.value, stored=stored
    )


def _progress_not_allowed() -> Response:
    return Response(
        status_code=status.HTTP_405_METHOD_NOT_ALLOWED,
        headers={"Allow": "GET, POST"},
        content='{"detail":"Method Not Allowed"}',
        media_type="application/json",
    )


# Every other method is answered here: left to the router, its Allow header would also name the
# methods of this path's PATCH and of these.
@router.api_route(
    "/{job_id:path}/progress",
    methods=["PUT", "DELETE", "OPTIONS", "TRACE"],
    include_in_schema=False,
)
async def progress_other_methods(job_id: str) -> Response:
    """405 (Allow: GET, POST) for a method ``/progress`` does not take, before any token check,
    as for every other path."""
    return _progress_not_allowed()


@router.patch("/{job_id:path}/progress", include_in_schema=False)
async def patch_job_named_progress(
    job_id: str,
    request: Request,
    ctx: Ctx,
    info: Authenticated,
    body: Annotated[dict[str, Any] | None, Body()] = None,
) -> Response:
    """A PATCH of a job whose own id ends in "/progress" (a pod so named) is that job's PATCH;
    of ``/progress`` itself, 405 (Allow: GET, POST)."""
    whole = f"{job_id}/progress"
    if await run_in_threadpool(_job_exists, ctx, whole):
        token = await require(Role.AGENT)(info)
        try:
            update = JobUpdate.model_validate(body or {})
        except PydanticValidationError as exc:
            raise RequestValidationError(exc.errors(), body=body) from exc
        job = await run_in_threadpool(update_job, whole, update, ctx, token)
        return JSONResponse(JobPublic.model_validate(job).model_dump(mode="json"))
    return _progress_not_allowed()


def _progress(summary: ProgressSummary) -> ProgressSummaryPublic:
    """The public form of a job's progress summary (the same fields, by name)."""
    return ProgressSummaryPublic.model_validate(summary, from_attributes=True)


def _job_exists(ctx: ServiceContext, job_id: str) -> bool:
    with ctx.engine.connect() as conn:
        return jobs_repo.get_job(conn, job_id=job_id) is not None


@router.get("/{job_id:path}/progress", response_model=JobProgressPublic)
def get_progress(
    job_id: str, ctx: Ctx, conn: ReadConn, scope: Scope
) -> JobProgressPublic | JSONResponse:
    """A job's progress readings in time order, with their summary (first and last total, units
    advanced, rate per second, when it last advanced); null summary when it reported none."""
    job = jobs_repo.get_job(conn, job_id=job_id)
    if job is None and (whole := jobs_repo.get_job(conn, job_id=f"{job_id}/progress")):
        # No job of that id, but one whose own id ends in "/progress" (a pod so named): its page.
        page = JobDetailPublic.model_validate(_job_page(ctx, conn, scope, whole))
        return JSONResponse(page.model_dump(mode="json"))
    visible_job(scope, job, job_id)
    found = progress.job_progress(conn, job_id=job_id)
    return JobProgressPublic(
        job_id=job_id,
        readings=[ReadingPublic.of(r) for r in found.readings],
        summary=None if found.summary is None else _progress(found.summary),
    )


@router.patch("/{job_id:path}", response_model=JobPublic)
def update_job(job_id: str, body: JobUpdate, ctx: Ctx, token: Agent) -> JobPublic:
    """Change a job's user, team, project or labels, or end it by setting ``ended_at``."""
    fields = body.model_dump(include=set(authz.CREATION_FIELDS), exclude_unset=True)
    with ctx.engine.begin() as conn:
        existing = jobs_repo.get_job(conn, job_id=job_id)
        if existing is None:
            raise NotFound(f"job {job_id!r} does not exist")
        what = "ended_at" if body.ended_at is not None else "job"
        authz.check_job_rights(token, intervals=existing["intervals"], field=what)
        try:
            authz.check_metadata_unchanged(token, existing=existing, fields=fields)
        except Conflict as exc:
            refused: Conflict | None = _record_claim(ctx, conn, token, existing, fields, exc)
        else:
            refused = None
        if refused is None:
            _apply_update(ctx, conn, token, job_id=job_id, body=body, fields=fields)
            job = jobs_repo.get_job(conn, job_id=job_id)
    if refused is not None:
        raise refused
    assert job is not None
    return _public(job)


def _apply_update(
    ctx: ServiceContext,
    conn: Connection,
    token: TokenInfo,
    *,
    job_id: str,
    body: JobUpdate,
    fields: dict[str, Any],
) -> None:
    """Write an allowed PATCH: the metadata, then the end of the token's intervals."""
    now = ctx.clock()
    existing = jobs_repo.get_job(conn, job_id=job_id)
    assert existing is not None
    if body.ended_at is not None:
        authz.check_job_end(token, intervals=existing["intervals"])
    jobs_repo.update_fields(conn, job_id=job_id, fields=fields, now=now)
    if body.ended_at is not None:
        jobs_repo.end_job(
            conn, job_id=job_id, ended_at=body.ended_at, now=now, only_node=authz.agent_node(token)
        )


@router.get("/{job_id:path}", response_model=JobDetailPublic, dependencies=[Expensive])
def get_job(job_id: str, ctx: Ctx, conn: ReadConn, scope: Scope) -> JobDetailPublic:
    """A job with its money summary (total and per GPU), recommendations and energy, and its
    unit of work (404 for a job outside a person's scope, as for one that does not exist)."""
    return _job_page(ctx, conn, scope, jobs_repo.get_job(conn, job_id=job_id), job_id)


def _job_page(
    ctx: ServiceContext,
    conn: Connection,
    scope: JobScope | None,
    found: JobRow | None,
    job_id: str | None = None,
) -> JobDetailPublic:
    """The page of the job ``found`` (404 where it is None or outside ``scope``)."""
    job = visible_job(scope, found, job_id or (found["id"] if found else ""))
    job_id = job["id"]
    now = ctx.clock()
    summary = job_summary(conn, settings=ctx.settings, job=job, now=now)
    reported, work = progress.job_work(
        conn, job_id=job_id, held_gpu_seconds=float(summary.summary["held_seconds"])
    )
    saving = savings.job_saving(conn, settings=ctx.settings, job=job, now=now, summary=summary)
    page = savings.without_applied_fix(summary, saving).as_dict()
    page["recommendations"] = savings.calibrated_fixes(conn, page["recommendations"])
    return JobDetailPublic.model_validate(
        {
            **_shown(job),
            **page,
            "savings": None if saving is None else saving.as_dict(),
            "progress": None if reported is None else _progress(reported),
            "unit_of_work": work.unit,
            "gpu_seconds_per_unit": work.gpu_seconds_per_unit,
            "unit_of_work_text": work.text,
            "odd_gpus": [
                OddGpuPublic(gpu_uuid=o.gpu_uuid, mean_duty=o.mean_duty, peers_duty=o.peers_duty)
                for o in useful_work.job_odd_gpus(
                    conn, ctx.settings, job_id, end=min(job["ended_at"] or now, now)
                )
            ],
        }
    )


@router.get("", response_model=list[JobListItemPublic], dependencies=[Expensive])
def list_jobs(
    ctx: Ctx,
    conn: ReadConn,
    scope: Scope,
    response: Response,
    start: str | None = Query(None, description=f"{query.TIME_HELP}; default end - 7d"),
    end: str | None = Query(None, description=f"{query.TIME_HELP}; default now"),
    since: str | None = Query(None, description=query.SINCE_HELP),
    user: str | None = None,
    team: str | None = None,
    sort: str = Query("waste", description=f"largest first by one of {', '.join(SORT_BYS)} (USD)"),
    limit: int = Query(1000, ge=1, le=10_000, description="at most this many jobs"),
    offset: int = Query(0, ge=0, description="skip this many jobs of the sorted list first"),
) -> list[dict[str, Any]]:
    """Jobs that held GPUs in [start, end) with their cost, waste (idle + fixable) and top
    cause over that window, largest waste first (or ``sort``): the page [offset, offset +
    limit) of them, with how many there are in the ``X-Total-Count`` header, and the window
    read in ``X-Report-Start`` and ``X-Report-End`` (a little before now where today is read
    from its sums)."""
    now = ctx.clock()
    start_at, end_at = query.window(
        start=start, end=end, since=since, now=now, default_seconds=7 * 86400
    )
    page = query.query_errors(job_list.jobs_with_costs)(
        conn, settings=ctx.settings, start=start_at, end=end_at, now=now,
        user=user, team=team, sort=sort, limit=limit, offset=offset, scope=scope,
    )  # fmt: skip
    response.headers["X-Total-Count"] = str(page.total)
    response.headers["X-Report-Start"] = start_at.isoformat()
    response.headers["X-Report-End"] = page.end.isoformat()
    return page.jobs


@verdicts.get(
    "/{job_id:path}",
    response_class=PlainTextResponse,
    dependencies=[Expensive],
    responses={200: {"content": {"text/plain": {"example": "gpuwarden: $12.40 on 2.0 GPU-h"}}}},
)
def get_verdict(job_id: str, ctx: Ctx, conn: ReadConn, token: AgentOrReader) -> str:
    """A job's verdict so far in one line of at most 250 printable ASCII characters (no ``|``,
    quotes or backslashes), for Slurm's AdminComment: cost, GPU-hours, waste, top cause, its
    fix and a link to the job's page; an agent may read the jobs its node registered."""
    job = visible_job(token.scope, jobs_repo.get_job(conn, job_id=job_id), job_id)
    authz.check_job_rights(token, intervals=job["intervals"], field="verdict")
    return admin_comment(conn, job=job, now=ctx.clock(), settings=ctx.settings)
