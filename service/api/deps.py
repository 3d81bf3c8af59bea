"""FastAPI dependencies: the app's runtime state, database connections and token checks.

Order matters under load: the token is checked (on the event loop, from caches when it can be)
and the read admitted before a database connection is taken, so a flood of bad tokens or readers
never holds connections that agents need.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

import anyio
from fastapi import Depends, HTTPException, Request, status
from sqlalchemy import Connection
from starlette.datastructures import State

from service.api import sessions
from service.api.gate import (
    MAX_SUSPECT_WAITING,
    TOKEN_CACHE_SECONDS,
    Admission,
    Throttled,
    TokenGate,
    monotonic,
)
from service.api.input_guard import BodyBudget
from service.api.oidc import OidcClient
from service.api.reads import WRITER_KEY
from service.context import ServiceContext
from service.db import foreground, jobs_repo, secrets_repo, sessions_repo, tokens_repo
from service.db.outages import OutageLog
from service.db.rows import JobRow
from service.db.tokens_repo import Role, TokenInfo, person_info
from service.roles import JobScope
from service.usecases.fleet import WastedTodayCache

T = TypeVar("T")


class ApiState(State):
    """Everything the running API holds, as ``app.state``: the ServiceContext and the HTTP
    edge's own token gate, admission slots, body budget, outage log and fleet-page cache."""

    ctx: ServiceContext
    gate: TokenGate
    admission: Admission
    body_budget: BodyBudget
    outage_log: OutageLog
    fleet_cache: WastedTodayCache
    oidc: OidcClient | None

    def __init__(
        self,
        *,
        ctx: ServiceContext,
        gate: TokenGate,
        admission: Admission,
        body_budget: BodyBudget,
        outage_log: OutageLog,
        fleet_cache: WastedTodayCache,
        oidc: OidcClient | None = None,
    ) -> None:
        super().__init__(
            {
                "ctx": ctx,
                "gate": gate,
                "admission": admission,
                "body_budget": body_budget,
                "outage_log": outage_log,
                "fleet_cache": fleet_cache,
                "oidc": oidc,
            }
        )


def api_state(request: Request) -> ApiState:
    """The ApiState the app factory put on the app."""
    state: ApiState = request.app.state
    return state


async def get_api_state(request: Request) -> ApiState:
    """api_state as a dependency; async, so it runs on the event loop with no thread hop."""
    return api_state(request)


AppState = Annotated[ApiState, Depends(get_api_state)]


def get_ctx(request: Request) -> ServiceContext:
    """The ServiceContext of the app's ApiState."""
    return api_state(request).ctx


Ctx = Annotated[ServiceContext, Depends(get_ctx)]


def _unauthorized() -> HTTPException:
    return HTTPException(
        status.HTTP_401_UNAUTHORIZED,
        detail="missing or invalid bearer token",
        headers={"WWW-Authenticate": "Bearer"},
    )


def bearer_token(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer`` header, or None."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _refused(gate: TokenGate, client: str, digest: str | None, *, looked_up: bool) -> HTTPException:
    """401 for a failed attempt, or 429 once the client has failed too often."""
    try:
        gate.refuse(client, digest, monotonic(), looked_up=looked_up)
    except Throttled as exc:
        return HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS,
            detail=str(exc),
            headers={"Retry-After": str(exc.retry_after_seconds)},
        )
    return _unauthorized()


def session_key(ctx: ServiceContext) -> str:
    """The console's session-signing key, made in the database at first need and then kept."""
    if ctx.session_key is None:
        with ctx.engine.begin() as conn:
            ctx.session_key = secrets_repo.get_or_create(
                conn, name=sessions.SECRET_NAME, now=ctx.clock()
            )
    return ctx.session_key


async def signing_key(ctx: ServiceContext) -> str:
    """session_key without blocking the event loop (the key is read once, then kept)."""
    if ctx.session_key is not None:
        return ctx.session_key
    key: str = await anyio.to_thread.run_sync(session_key, ctx)
    return key


def _session_ended(gate: TokenGate, client: str) -> HTTPException:
    """401 for a bad session cookie, counted against the client like a bad token."""
    refused = _refused(gate, client, None, looked_up=False)
    if refused.status_code != status.HTTP_401_UNAUTHORIZED:
        return refused
    return HTTPException(
        status.HTTP_401_UNAUTHORIZED,
        detail="the console session is missing, expired or ended; log in again",
        headers={"WWW-Authenticate": "Bearer"},
    )


async def _shared_lookup(
    request: Request, key: str, look_up: Callable[[], T], lane: str = "auth"
) -> T:
    """``look_up()`` on the auth slots, run once for all the requests awaiting ``key`` at once.

    When a cached token expires, every request carrying it would otherwise queue a lookup of its
    own on the few auth slots, and agents' lookups would wait behind them.
    """
    state = api_state(request)
    gate = state.gate
    pending = gate.lookups.get(key)
    if pending is None:
        admission = state.admission
        pending = asyncio.ensure_future(
            anyio.to_thread.run_sync(look_up, limiter=admission.limiter(lane))
        )
        gate.lookups[key] = pending
        pending.add_done_callback(lambda _: gate.lookups.pop(key, None))
    # Shielded: one waiter that goes away must not cancel the lookup the others await.
    result: T = await asyncio.shield(pending)
    return result


async def session_ended(request: Request, ctx: ServiceContext, session: sessions.Session) -> bool:
    """Whether ``session`` was ended by logging out, or (a person's) by an admin signing the
    person out everywhere (on any replica: read at most every TOKEN_CACHE_SECONDS; an ended one
    is remembered as such)."""
    hit = ctx.session_ended.get(session.nonce)
    if hit is not None and (hit[0] or monotonic() - hit[1] < TOKEN_CACHE_SECONDS):
        return hit[0]
    engine = ctx.ingest_engine or ctx.engine
    person = session.person
    expires_at = datetime.fromtimestamp(session.expires_at, tz=UTC)

    def look_up() -> bool:
        with engine.connect() as conn:
            return sessions_repo.is_ended(conn, nonce=session.nonce) or (
                person is not None
                and sessions_repo.person_ended(conn, user=person.user, expires_at=expires_at)
            )

    ended = await _shared_lookup(request, f"ended:{session.nonce}", look_up)
    ctx.session_ended[session.nonce] = (ended, monotonic())
    return ended


async def session_authenticated(
    request: Request, ctx: ServiceContext, cookie: str, gate: TokenGate, client: str
) -> TokenInfo:
    """The token a console session cookie names, checked like a bearer token; 401 if none.

    A write (any method but GET, HEAD, OPTIONS) also needs the session's CSRF token in the
    X-CSRF-Token header: a cookie alone is sent by the browser on any page's behalf.
    """
    key = await signing_key(ctx)
    session = sessions.decode(cookie, key=key, now=ctx.clock().timestamp())
    if session is None or await session_ended(request, ctx, session):
        raise _session_ended(gate, client)
    if session.person is not None:
        info = person_info(session.person, now=ctx.clock())
    else:
        info = await _session_token(request, ctx, session, gate, client)
    if request.method not in sessions.SAFE_METHODS and not sessions.csrf_ok(
        session, request.headers.get(sessions.CSRF_HEADER), key=key
    ):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            detail=f"{sessions.CSRF_HEADER}: a write made with the console's session cookie "
            "needs the CSRF token that GET /api/v1/session returns",
        )
    request.state.session = session
    return info


async def _session_token(
    request: Request,
    ctx: ServiceContext,
    session: sessions.Session,
    gate: TokenGate,
    client: str,
) -> TokenInfo:
    """The live token a token login's session names (cached like bearer tokens); 401 if none."""
    cached = ctx.session_tokens.get(session.token_id)
    if cached is None or monotonic() - cached[2] >= TOKEN_CACHE_SECONDS:
        engine = ctx.ingest_engine or ctx.engine

        def look_up() -> tuple[TokenInfo, str] | None:
            with engine.connect() as conn:
                return tokens_repo.live_token_by_id(conn, token_id=session.token_id)

        found = await _shared_lookup(request, f"session:{session.token_id}", look_up)
        # A revoked token is remembered as such for the cache time too: no lookup per request.
        cached = (None, "", monotonic()) if found is None else (*found, monotonic())
        ctx.session_tokens[session.token_id] = cached
    info, token_hash, _ = cached
    if info is None or info.role is Role.AGENT or not sessions.matches_token(session, token_hash):
        raise _session_ended(gate, client)
    return info


async def authenticated(request: Request, ctx: Ctx) -> TokenInfo:
    """The caller's token (bearer, else the console's session cookie), or 401 (429 after too
    many failures from the same client).

    Known tokens come from the cache; a token looked up and refused within the cache time is
    refused without a lookup; other lookups run a few at a time on the ingest pool.
    """
    gate = api_state(request).gate
    client = gate.client_of(request)
    token = bearer_token(request)
    if token is None:
        cookie = request.cookies.get(sessions.COOKIE_NAME)
        if not cookie:
            raise _refused(gate, client, None, looked_up=False)
        info = await session_authenticated(request, ctx, cookie, gate, client)
    else:
        info = await check_token(request, ctx, token)
    if request.method not in sessions.SAFE_METHODS:
        setattr(request.state, WRITER_KEY, info.id)  # its reads then wait for this write
    return info


async def check_token(request: Request, ctx: ServiceContext, token: str) -> TokenInfo:
    """The live token ``token``, from the cache or the database; 401 (or 429) if none."""
    gate = api_state(request).gate
    client = gate.client_of(request)
    digest = tokens_repo.hash_token(token)
    now = monotonic()
    info = gate.cached(digest, now)
    if info is None and gate.needs_revocations(digest, now):
        await _read_revocations(request, ctx)
        info = gate.cached(digest, monotonic())
    if info is not None:
        return info
    if gate.known_bad(digest, now):
        raise _refused(gate, client, digest, looked_up=False)
    # A token never tried may be valid whatever its client did before: looked up, on a lane of
    # its own when the client is throttled (and refused only past a flood's worth waiting).
    lane = gate.lane(client, digest, now)
    if lane == "suspect" and gate.suspect_waiting >= MAX_SUSPECT_WAITING:
        raise _refused(gate, client, digest, looked_up=False)
    engine = ctx.ingest_engine or ctx.engine

    def look_up() -> TokenInfo | None:
        with engine.connect() as conn:
            return tokens_repo.authenticate(conn, token=token)

    generation = gate.generation
    gate.suspect_waiting += lane == "suspect"
    try:
        info = await _shared_lookup(request, digest, look_up, lane)
    finally:
        gate.suspect_waiting -= lane == "suspect"
    if info is None:
        raise _refused(gate, client, digest, looked_up=True)
    gate.accept(digest, info, monotonic(), generation)
    return info


async def _read_revocations(request: Request, ctx: ServiceContext) -> None:
    """Read how many tokens are revoked (one query for all the requests waiting on it) and
    tell the token gate, so tokens looked up since the last revocation keep passing."""
    engine = ctx.ingest_engine or ctx.engine

    def read() -> tuple[int, float]:
        started = monotonic()
        with engine.connect() as conn:
            return tokens_repo.revoked_count(conn), started

    count, started = await _shared_lookup(request, "revocations", read)
    api_state(request).gate.saw_revocations(count, started)


Authenticated = Annotated[TokenInfo, Depends(authenticated)]


async def admit_read(request: Request, _: Authenticated) -> AsyncIterator[None]:
    """Hold one of the bounded read slots for the request, or answer 503 with Retry-After."""
    admission = api_state(request).admission
    async with admission.enter("read"):
        yield


# Series longer than this read enough rows to count as expensive.
LONG_SERIES_SECONDS = 86400.0


def _span_seconds(request: Request) -> float:
    """The [start, end) span a series request asks for (an hour by default), in seconds."""
    try:
        start, end = (request.query_params.get(k) for k in ("start", "end"))
        if start is None:
            return 3600.0
        t0 = datetime.fromisoformat(start.replace("Z", "+00:00"))
        t1 = datetime.fromisoformat(end.replace("Z", "+00:00")) if end else None
        if t1 is None:
            return LONG_SERIES_SECONDS + 1  # from a start up to now: assume long
        return (t1 - t0).total_seconds()
    except (ValueError, TypeError):
        return 0.0  # malformed: validation answers 422 cheaply


async def admit_expensive(request: Request, _: Authenticated) -> AsyncIterator[None]:
    """Hold one of the few slots for expensive reads (reports, job summaries, long series)."""
    if request.url.path.endswith("/series"):
        if _span_seconds(request) <= LONG_SERIES_SECONDS:
            yield
            return
    else:
        # The other expensive reads sum costs: read_conn takes them to the primary.
        request.state.sums_costs = True
    admission = api_state(request).admission
    async with admission.enter("expensive"):
        yield


# Put on a route (``dependencies=[Expensive]``) so it runs before the route takes a connection.
Expensive = Depends(admit_expensive)


def read_conn(
    request: Request, ctx: Ctx, info: Authenticated, _: Annotated[None, Depends(admit_read)]
) -> Iterator[Connection]:
    """A connection for reading, closed after the request; taken only once the read is admitted,
    on the read replica when the read router allows it for this caller, else on the primary
    (always for an expensive read that sums costs, see ``ReadRouter.route``).

    Every read of one request sees one snapshot, so a page's rows and its totals agree while
    ingest, rollups and the cost-days job write."""
    costs = getattr(request.state, "sums_costs", False)
    with foreground.reading(), ctx.reads.connect(info.id, costs=costs) as conn:
        if conn.dialect.name == "postgresql":
            # For this request's transaction only: background jobs keep no limit.
            seconds = ctx.settings.db_statement_timeout_seconds
            conn.exec_driver_sql(f"SET LOCAL statement_timeout = {int(seconds * 1000)}")
            # Allowed on a hot standby too; a read-only transaction never fails to serialize.
            conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        else:
            # The driver begins no transaction for reads: each SELECT would see the newest data.
            conn.exec_driver_sql("BEGIN")
        yield conn


def write_conn(ctx: Ctx, _: Authenticated) -> Iterator[Connection]:
    """A connection in a transaction that commits when the request succeeds."""
    with ctx.engine.begin() as conn:
        yield conn


ReadConn = Annotated[Connection, Depends(read_conn)]
# scope="function": commit before the response is sent, so a 2xx means the write is visible.
WriteConn = Annotated[Connection, Depends(write_conn, scope="function")]


def require(
    *roles: Role, scoped: bool = False
) -> Callable[[TokenInfo], Coroutine[Any, Any, TokenInfo]]:
    """A dependency that lets through callers of ``roles`` (admin always) and answers 403 else.

    A person limited to their own and their teams' jobs passes only where ``scoped`` says the
    route narrows what it shows to the caller's scope (``Scope``); every other route shows the
    whole fleet and answers them 403: the one place a person's reach is decided."""
    allowed = {*roles, Role.ADMIN}

    async def check(info: Authenticated) -> TokenInfo:
        if info.role not in allowed:
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                detail=f"a token with role {info.role.value!r} may not do this; "
                f"needs one of {sorted(r.value for r in allowed)}",
            )
        if not scoped and info.person is not None and info.scope is not None:
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                detail=f"{info.person.user} sees their own and their teams' jobs; this shows the "
                "whole fleet (a fleet-reader group sees it: GPUWARDEN_OIDC_READER_GROUPS)",
            )
        return info

    return check


Reader = Annotated[TokenInfo, Depends(require(Role.READER))]
Agent = Annotated[TokenInfo, Depends(require(Role.AGENT))]
Admin = Annotated[TokenInfo, Depends(require())]
# A reader that may be a person limited to a scope: the route narrows what it shows.
ScopedReader = Annotated[TokenInfo, Depends(require(Role.READER, scoped=True))]


async def job_scope(info: ScopedReader) -> JobScope | None:
    """The jobs the caller may see (None: every job): routes that take it show only those."""
    return info.scope


Scope = Annotated[JobScope | None, Depends(job_scope)]


def visible_job(scope: JobScope | None, job: JobRow | None, job_id: str) -> JobRow:
    """``job`` when it exists and ``scope`` allows it; 404 else, so a person cannot tell another
    team's job from one that does not exist."""
    if job is None or (scope is not None and not scope.allows(job.get("user"), job.get("team"))):
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"job {job_id!r} does not exist")
    return job


def gpus_in_scope(conn: Connection, scope: JobScope | None, uuids: list[str]) -> None:
    """For a GPU's series: a person reads those of GPUs a job in their scope held; 404 else,
    as for a GPU that does not exist."""
    if scope is None:
        return
    held = jobs_repo.gpus_held_in_scope(conn, scope=scope, uuids=uuids)
    for uuid in uuids:
        if uuid not in held:
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"gpu: no GPU {uuid}")


def one_job_in_scope(
    conn: Connection,
    scope: JobScope | None,
    job_id: str | None,
    *,
    user: str | None = None,
    team: str | None = None,
) -> None:
    """For lists of one job's rows (alerts, ladder steps, notices): a person must name a job
    (``job``) in their scope, or (where the route takes them) themselves or one of their teams;
    404 for a job outside it, 403 else."""
    if scope is None:
        return
    if job_id is None and (user in scope.users or team in scope.teams):
        return
    if job_id is None:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            detail="job: a person lists these for one of their own or their teams' jobs (job=)",
        )
    visible_job(scope, jobs_repo.get_job(conn, job_id=job_id), job_id)
