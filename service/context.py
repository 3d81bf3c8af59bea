"""What the running central service holds: settings, engine, clock and telemetry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime

from cachetools import LRUCache
from sqlalchemy import Engine

from service.clock import Clock, utc_now
from service.core.diagnosis import thresholds_of
from service.costs.integrals import Thresholds
from service.db.ingest_repo import IngestCache
from service.db.tokens_repo import TokenInfo
from service.reads import ReadRouter
from service.settings import Settings
from service.telemetry import Telemetry

# Console sessions kept in each cache at most (the least recently used are forgotten first).
SESSION_CACHE_ENTRIES = 100_000


@dataclass
class ServiceContext:
    """The central service's dependencies, built once by the app factory and passed down."""

    settings: Settings
    engine: Engine
    clock: Clock = utc_now
    telemetry: Telemetry = field(default_factory=Telemetry)
    known_partitions: set[date] = field(default_factory=set)
    ingest_cache: IngestCache = field(default_factory=IngestCache)
    # Refused GPU claims (GPU uuid, claiming node, holding node): when each was last logged.
    claims_logged: dict[tuple[str, str, str], datetime] = field(default_factory=dict)
    # Console sessions: the token each names (None once revoked) with its stored hash, as last
    # read, and when (monotonic seconds).
    session_tokens: LRUCache[int, tuple[TokenInfo | None, str, float]] = field(
        default_factory=lambda: LRUCache(SESSION_CACHE_ENTRIES)
    )
    session_key: str | None = None  # the console's signing key, read from the database once
    # Console sessions (by nonce): whether logged out, as last read, and when (monotonic seconds).
    session_ended: LRUCache[str, tuple[bool, float]] = field(
        default_factory=lambda: LRUCache(SESSION_CACHE_ENTRIES)
    )
    # Agents' ingest (and token lookups) on a pool of their own that reads cannot exhaust;
    # None: the one engine serves everything (tools and tests that build a context by hand).
    ingest_engine: Engine | None = None
    # Where reads go (the read replica or the primary); None: built on first use, primary only.
    read_router: ReadRouter | None = None
    # Run by the app on shutdown (for example to release the evaluator's leader lock).
    shutdown_hooks: list[Callable[[], None]] = field(default_factory=list)

    @property
    def reads(self) -> ReadRouter:
        """The read router: GET routes, the console, reports and /metrics connect through it."""
        if self.read_router is None:
            self.read_router = ReadRouter(
                primary=self.engine, replica=None, telemetry=self.telemetry
            )
        return self.read_router

    @property
    def thresholds(self) -> Thresholds:
        """The waste-model thresholds from settings."""
        return thresholds_of(self.settings)
