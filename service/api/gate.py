"""Overload control: token checks without a held connection, failure throttling, admission of reads.

Three rules keep agents' ingest working while readers or attackers overload the service:
- a token is checked before any database connection is taken; known tokens and known-bad tokens
  cost no database round trip (positive and negative caches), lookups of new tokens run a few at
  a time on the ingest pool;
- each client (the peer address, or the forwarded one behind a trusted proxy) may fail a limited
  number of times before its failures are answered 429; the throttle keys on the token tried as
  well: a token seen valid is never throttled, and a token never tried before is still looked
  up (on a lane of its own, one lookup at a time, so a failing client cannot take the lookups of
  others), so a valid token's first request passes even when its address keeps failing;
- reads are admitted a bounded number at a time, expensive ones (cost reports, job summaries, long
  series) fewer still, answered 503 with Retry-After past the bound instead of queueing;
- ingest batches wait a bounded time for one of their slots (at most half the timeout the agent
  sends), then are answered 503 with Retry-After, so no agent waits out its own timeout.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import math
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
from cachetools import LRUCache
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from service.db.tokens_repo import TokenInfo, hash_token
from service.errors import Unavailable
from service.settings import Settings

# A revoked token stops working within this many seconds: a token looked up valid passes that
# long, and after it as long as the count of revoked tokens, read at most this often per
# process, has not changed since its lookup began (one query per process, not one per batch).
TOKEN_CACHE_SECONDS = 5.0
# A token seen valid keeps passing the failure throttle of its client for this long.
KNOWN_GOOD_SECONDS = 7 * 86400.0
# Entries kept per cache: attackers choose tokens and addresses, memory stays bounded.
MAX_ENTRIES = 100_000
# Lookups of new tokens from throttled clients waiting at once; past it a flood is answered 429.
MAX_SUSPECT_WAITING = 64
# The console's login, whose token comes in the body rather than a header.
LOGIN_PATH = "/api/v1/session"


class Throttled(Exception):
    """The client failed authentication too often; retry after ``retry_after_seconds``."""

    def __init__(self, retry_after_seconds: int) -> None:
        super().__init__(
            f"too many failed authentication attempts; retry in {retry_after_seconds}s"
        )
        self.retry_after_seconds = retry_after_seconds


def parse_networks(text: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """Comma-separated CIDRs (or single addresses) as networks."""
    return tuple(
        ipaddress.ip_network(p.strip(), strict=False) for p in text.split(",") if p.strip()
    )


def _in(address: str, nets: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in nets)


@dataclass
class _Bucket:
    tokens: float
    at: float


class TokenGate:
    """Caches of good and bad tokens and the per-client budget of failed attempts."""

    def __init__(self, settings: Settings) -> None:
        self.burst = float(settings.auth_failure_burst)
        self.refill_per_second = settings.auth_failure_refill_per_second
        self.trusted_proxies = parse_networks(settings.trusted_proxies)
        self._lock = threading.Lock()
        # digest -> (token, when its lookup ended, the revocation generation its lookup began in)
        # Every cache holds at most MAX_ENTRIES, forgetting the least recently used first.
        self._good: LRUCache[str, tuple[TokenInfo, float, int]] = LRUCache(MAX_ENTRIES)
        # Revocations seen: how many tokens were revoked, when that count was last read (its
        # read's start, monotonic), and a generation that moves whenever the count does.
        self._revoked_count: int | None = None
        self._revoked_read_at = -math.inf
        self.generation = 0
        self._bad: LRUCache[str, float] = LRUCache(MAX_ENTRIES)  # digest -> refused at
        self._known_good: LRUCache[str, float] = LRUCache(MAX_ENTRIES)  # digest -> seen valid at
        # Token lookups under way (by digest, or session:<token id>): when a cached token expires,
        # the requests that carry it share one lookup instead of queueing one each behind the few
        # auth slots.
        self.lookups: dict[str, asyncio.Future[Any]] = {}
        self.suspect_waiting = 0
        self._buckets: LRUCache[str, _Bucket] = LRUCache(MAX_ENTRIES)

    def client_of(self, request: Request) -> str:
        """The client's address: the peer, or the last untrusted X-Forwarded-For hop behind a
        trusted proxy (a client cannot choose its own address by sending the header itself)."""
        peer = request.client.host if request.client else "unknown"
        return self.client_from(peer, request.headers.get("x-forwarded-for", ""))

    def client_from(self, peer: str, forwarded_for: str) -> str:
        """client_of for a peer address and an X-Forwarded-For header value."""
        if not self.trusted_proxies or not _in(peer, self.trusted_proxies):
            return peer
        hops = [h.strip() for h in forwarded_for.split(",")]
        for hop in reversed([h for h in hops if h]):
            if not _in(hop, self.trusted_proxies):
                return hop
        return peer

    def https(self, request: Request) -> bool:
        """Whether the client reached us over HTTPS: directly, or through a trusted proxy that
        says so in X-Forwarded-Proto (its first value, the client's side)."""
        if request.url.scheme == "https":
            return True
        peer = request.client.host if request.client else "unknown"
        if not self.trusted_proxies or not _in(peer, self.trusted_proxies):
            return False
        proto = request.headers.get("x-forwarded-proto", "").split(",")[0]
        return proto.strip().lower() == "https"

    def throttled(self, client: str, digest: str | None, now: float) -> bool:
        """Whether this attempt is refused before any work: the client has spent its failure
        budget and it brings no token, or one refused within TOKEN_CACHE_SECONDS (a token not
        tried before may be valid, so it is looked up: see ``lane``)."""
        if digest is not None and not self.known_bad(digest, now):
            return False
        with self._lock:
            return self._refilled(client, now).tokens < 1

    def cached(self, digest: str, now: float) -> TokenInfo | None:
        """The token's record if it was looked up valid within TOKEN_CACHE_SECONDS, or looked up
        in the current revocation generation, read within TOKEN_CACHE_SECONDS."""
        with self._lock:
            hit = self._good.get(digest)
            current = now - self._revoked_read_at < TOKEN_CACHE_SECONDS
            generation = self.generation
        if hit is None:
            return None
        info, looked_up_at, looked_up_in = hit
        if now - looked_up_at < TOKEN_CACHE_SECONDS or (current and looked_up_in == generation):
            return info
        return None

    def needs_revocations(self, digest: str, now: float) -> bool:
        """Whether reading the count of revoked tokens would let a cached token pass: it was
        looked up in the current generation, and the count was read too long ago."""
        with self._lock:
            hit = self._good.get(digest)
            stale = now - self._revoked_read_at >= TOKEN_CACHE_SECONDS
            return stale and hit is not None and hit[2] == self.generation

    def saw_revocations(self, count: int, read_at: float) -> None:
        """Record the count of revoked tokens read from ``read_at`` (monotonic, the read's
        start); a count unlike the last one (the first one too: a token may have been revoked
        before it) starts a new generation, so every token looked up before is looked up again."""
        with self._lock:
            if read_at <= self._revoked_read_at:
                return
            if count != self._revoked_count:
                self.generation += 1
                self._revoked_count = count
            self._revoked_read_at = read_at

    def known_bad(self, digest: str, now: float) -> bool:
        """Whether the token was looked up and refused within TOKEN_CACHE_SECONDS."""
        with self._lock:
            at = self._bad.get(digest)
        return at is not None and now - at < TOKEN_CACHE_SECONDS

    def lane(self, client: str, digest: str, now: float) -> str:
        """Where the lookup of a token not in the caches runs: ``auth`` (the shared auth slots)
        for a token seen valid within KNOWN_GOOD_SECONDS or a client with failure budget left,
        else ``suspect`` (one lookup at a time, apart from everyone else's)."""
        with self._lock:
            seen_at = self._known_good.get(digest)
            if seen_at is not None and now - seen_at < KNOWN_GOOD_SECONDS:
                return "auth"
            return "auth" if self._refilled(client, now).tokens >= 1 else "suspect"

    def accept(
        self, digest: str, info: TokenInfo, now: float, generation: int | None = None
    ) -> None:
        """Remember a valid token, looked up from revocation generation ``generation`` (the
        current one if not given)."""
        with self._lock:
            begun_in = self.generation if generation is None else generation
            self._good[digest] = (info, now, begun_in)
            self._bad.pop(digest, None)
            self._known_good[digest] = now

    def refuse(self, client: str, digest: str | None, now: float, *, looked_up: bool) -> None:
        """Count a failed attempt of ``client``; raises Throttled once its budget is spent."""
        with self._lock:
            if digest is not None and looked_up:
                self._bad[digest] = now
                self._good.pop(digest, None)
                self._known_good.pop(digest, None)
            bucket = self._refilled(client, now)
            if bucket.tokens >= 1:
                bucket.tokens -= 1
                return
            wait = (1 - bucket.tokens) / self.refill_per_second
        raise Throttled(max(1, math.ceil(wait)))

    def _refilled(self, client: str, now: float) -> _Bucket:
        bucket = self._buckets.get(client)  # a read makes it the most recently used
        if bucket is None:
            bucket = self._buckets[client] = _Bucket(self.burst, now)
        else:
            gained = (now - bucket.at) * self.refill_per_second
            bucket.tokens = min(self.burst, bucket.tokens + gained)
            bucket.at = now
        return bucket


class Admission:
    """Bounded concurrent reads: a request past the bound waits briefly, then is answered 503."""

    def __init__(self, settings: Settings) -> None:
        self.wait_seconds = settings.admission_wait_seconds
        self.read_slots = settings.max_concurrent_reads
        self.expensive_slots = settings.max_expensive_reads
        self.ingest_slots = settings.ingest_max_concurrent
        self.auth_slots = settings.auth_max_concurrent_lookups
        self._sems: dict[str, anyio.Semaphore] = {}
        self.ingest_waiting = 0  # batches waiting for an ingest slot now
        self._limiters: dict[str, anyio.CapacityLimiter] = {}

    def _sem(self, kind: str, slots: int) -> anyio.Semaphore:
        # Made on first use, inside the event loop that serves the requests.
        sem = self._sems.get(kind)
        if sem is None:
            sem = self._sems[kind] = anyio.Semaphore(slots)
        return sem

    def limiter(self, kind: str) -> anyio.CapacityLimiter:
        """Worker threads of their own for ``ingest``, ``auth`` or ``suspect`` (new tokens of
        throttled clients: one at a time), apart from the reads' pool."""
        lim = self._limiters.get(kind)
        if lim is None:
            slots = {"ingest": self.ingest_slots, "suspect": 1}.get(kind, self.auth_slots)
            lim = self._limiters[kind] = anyio.CapacityLimiter(slots)
        return lim

    @asynccontextmanager
    async def enter(self, kind: str) -> AsyncIterator[None]:
        """Hold one slot of ``kind`` ("read" or "expensive") for the block, or raise Unavailable."""
        slots = self.read_slots if kind == "read" else self.expensive_slots
        sem = self._sem(kind, slots)
        acquired = False
        with anyio.move_on_after(self.wait_seconds):
            await sem.acquire()
            acquired = True
        if not acquired:
            what = (
                "expensive reads (reports, job summaries, long series)"
                if kind != "read"
                else "reads"
            )
            raise Unavailable(
                f"the service is busy: {slots} {what} are running; retry shortly",
                retry_after_seconds=1,
            )
        try:
            yield
        finally:
            sem.release()

    @asynccontextmanager
    async def ingest_slot(
        self, wait_seconds: float, scope: anyio.CancelScope
    ) -> AsyncIterator[None]:
        """Hold one of the ingest slots for the block, waiting at most ``wait_seconds`` (or until
        ``scope`` is cancelled: the client went away); else raise Unavailable."""
        sem = self._sem("ingest", self.ingest_slots)
        try:
            sem.acquire_nowait()
            acquired = True
        except anyio.WouldBlock:
            acquired = await self._wait_ingest(sem, wait_seconds, scope)
        if not acquired:
            raise Unavailable(
                f"the service is busy: all {self.ingest_slots} ingest slots are storing batches "
                f"and {self.ingest_waiting} more wait; nothing stored, retry shortly",
                retry_after_seconds=1,
            )
        try:
            yield
        finally:
            sem.release()

    async def _wait_ingest(
        self, sem: anyio.Semaphore, wait_seconds: float, scope: anyio.CancelScope
    ) -> bool:
        self.ingest_waiting += 1
        try:
            with scope:
                scope.deadline = min(scope.deadline, anyio.current_time() + wait_seconds)
                await sem.acquire()
                return True
        finally:
            self.ingest_waiting -= 1
        return False

    def busy(self) -> dict[str, int]:
        """Slots in use per kind (for tests and metrics)."""
        out = {}
        for kind, sem in self._sems.items():
            total = {"read": self.read_slots, "ingest": self.ingest_slots}.get(
                kind, self.expensive_slots
            )
            out[kind] = total - sem.value
        return out


def monotonic() -> float:
    """Seconds on the monotonic clock (the caches' and the throttle's time)."""
    return time.monotonic()


class FailFast:
    """ASGI middleware answering 429 to a throttled client's missing or known-bad token before
    any routing.

    Under a flood the cheapest refusal keeps the event loop's turns short, which is what agents'
    batches wait on; the full check (FastAPI's dependency) still runs for everyone else.
    """

    def __init__(self, app: ASGIApp, *, gate: TokenGate) -> None:
        self.app = app
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/api/"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        token = token.strip()
        digest = hash_token(token) if scheme.lower() == "bearer" and token else None
        client = scope.get("client")
        peer = client[0] if client else "unknown"
        who = self.gate.client_from(peer, headers.get(b"x-forwarded-for", b"").decode("latin-1"))
        now = monotonic()
        # A console session (a cookie, no bearer) is judged by the full check, never refused
        # here, and so is a login (its token is in the body).
        session = digest is None and (
            b"cookie" in headers or (scope["path"] == LOGIN_PATH and scope["method"] == "POST")
        )
        if session or not self.gate.throttled(who, digest, now):
            await self.app(scope, receive, send)
            return
        try:
            self.gate.refuse(who, digest, now, looked_up=False)
        except Throttled as exc:
            body = json.dumps({"detail": str(exc)}).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 429,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"retry-after", str(exc.retry_after_seconds).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
