"""Where reads go: the read replica while it is up and fresh enough for the reader, else the
primary.

The rule (docs/operations.md, "Reads off the primary"):
- no replica configured: every read goes to the primary;
- the replica is down (a connection failed) or was not measured: the primary, until the next
  check (``database_read_check_seconds``) finds it back; logged once an outage, counted;
- the replica is further behind than ``database_read_max_lag_seconds``, or not replicating at
  all (promoted): the primary;
- the caller's token wrote since the replica last proved itself caught up past that write: the
  primary (a console page read right after its own POST shows what it just changed);
- else the replica.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge
from sqlalchemy import Connection, Engine

from service.db.outages import OUTAGE_ERRORS, OutageLog
from service.db.replica import ReplicaLag, measure_lag, primary_position
from service.telemetry import Telemetry

log = logging.getLogger(__name__)

# Why a read went where it went (gpuwarden_replica_reads_total's outcome label).
READ_OUTCOMES: tuple[str, ...] = (
    "replica",
    "own_write",
    "lagging",
    "down",
    "not_replicating",
    "costs",
)
# Token ids remembered as recent writers before the oldest are forgotten.
MAX_WRITERS = 10_000


class ReplicaMetrics:
    """The replica's families on /metrics, registered only when a replica is configured."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.reads = Counter(
            "gpuwarden_replica_reads",
            "Reads of the API, console, reports and /metrics by where they went: replica, or "
            "the primary because of the caller's own recent write (own_write), a replica "
            "behind database_read_max_lag_seconds (lagging), down or not_replicating.",
            ["outcome"],
            registry=registry,
        )
        for outcome in READ_OUTCOMES:
            self.reads.labels(outcome)
        self.replica_up = Gauge(
            "gpuwarden_replica_up",
            "1 when the read replica answered its last check, else 0.",
            registry=registry,
        )
        self.replica_lag_seconds = Gauge(
            "gpuwarden_replica_lag_seconds",
            "How far the read replica's replay is behind the primary, 0 when caught up, NaN "
            "when behind with nothing replayed since it started (seconds).",
            registry=registry,
        )
        self.replica_lag_bytes = Gauge(
            "gpuwarden_replica_lag_bytes",
            "WAL the read replica has not replayed yet, from the primary's position (bytes).",
            registry=registry,
        )


@dataclass(frozen=True)
class ReplicaState:
    """The replica as last measured: ``status`` is ok, lagging, down, not_replicating or
    unchecked; lag figures are None when unknown."""

    status: str
    lag_seconds: float | None
    lag_bytes: int | None
    max_lag_seconds: float
    checked_seconds_ago: float | None

    def as_dict(self) -> dict[str, object]:
        """The state as /healthz shows it."""
        return asdict(self)  # every field, in their order


class ReadRouter:
    """Chooses the engine of each read and keeps the replica's measured lag (monotonic time)."""

    def __init__(
        self,
        *,
        primary: Engine,
        replica: Engine | None,
        telemetry: Telemetry,
        max_lag_seconds: float = 10.0,
        check_seconds: float = 5.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.primary = primary
        self.replica = replica
        self.max_lag_seconds = max_lag_seconds
        self.check_seconds = check_seconds
        self._monotonic = monotonic
        self._probing = threading.Lock()
        self._wrote: dict[int, float] = {}  # token id -> when it last wrote
        self._checked_at = -math.inf  # when the last check began
        self._fresh_as_of = -math.inf  # every commit before this is on the replica
        self._lag: ReplicaLag | None = None
        self._down = False
        self._outages = OutageLog(log, "reading from the primary instead")
        if replica is not None:
            self._metrics = ReplicaMetrics(telemetry.registry)

    def noted_write(self, token_id: int) -> None:
        """Remember that ``token_id`` has just committed a write (its next reads need it)."""
        if self.replica is None:
            return
        if len(self._wrote) >= MAX_WRITERS:
            self._wrote.clear()  # forgetting only sends those tokens' reads to the replica
        self._wrote[token_id] = self._monotonic()

    def check(self) -> None:
        """Measure the replica's lag now (unless another thread is measuring it)."""
        if self.replica is None or not self._probing.acquire(blocking=False):
            return
        try:
            started = self._monotonic()
            self._checked_at = started
            try:
                primary_lsn = primary_position(self.primary)
            except OUTAGE_ERRORS:
                return  # the primary is away: its own reads answer 503, the replica is unjudged
            try:
                lag = measure_lag(self.replica, primary_lsn=primary_lsn)
            except OUTAGE_ERRORS as exc:
                self._failed(exc)
                return
            self._lag, self._down = lag, False
            if lag.replicating and lag.lag_seconds is not None:
                self._fresh_as_of = max(self._fresh_as_of, started - lag.lag_seconds)
            self._publish()
        finally:
            self._probing.release()

    def _failed(self, exc: BaseException) -> None:
        self._down = True
        self._outages.failed(exc, "the read replica")
        self._publish()

    def _publish(self) -> None:
        t = self._metrics
        t.replica_up.set(0.0 if self._down else 1.0)
        lag = self._lag
        if lag is not None and not self._down:
            t.replica_lag_bytes.set(lag.lag_bytes)
            t.replica_lag_seconds.set(math.nan if lag.lag_seconds is None else lag.lag_seconds)

    def state(self) -> ReplicaState | None:
        """The replica's state, measured again if the last check is older than check_seconds;
        None without a replica."""
        if self.replica is None:
            return None
        if self._monotonic() - self._checked_at >= self.check_seconds:
            self.check()
        lag = self._lag
        if self._down:
            status = "down"
        elif lag is None:
            status = "unchecked"
        elif not lag.replicating:
            status = "not_replicating"
        elif lag.lag_seconds is None or lag.lag_seconds > self.max_lag_seconds:
            status = "lagging"
        else:
            status = "ok"
        ago = self._monotonic() - self._checked_at
        return ReplicaState(
            status=status,
            lag_seconds=None if lag is None or self._down else lag.lag_seconds,
            lag_bytes=None if lag is None or self._down else lag.lag_bytes,
            max_lag_seconds=self.max_lag_seconds,
            checked_seconds_ago=None if math.isinf(ago) else round(ago, 3),
        )

    def route(self, token_id: int | None, *, costs: bool = False) -> tuple[Engine, str]:
        """The engine for a read by ``token_id`` (None: no caller's own writes to wait for),
        and why (one of READ_OUTCOMES; "primary" without a replica). A read that sums costs
        (``costs``) goes to the primary: it joins temporary tables, which a hot standby cannot
        create."""
        if self.replica is None:
            return self.primary, "primary"
        if costs:
            return self.primary, "costs"
        state = self.state()
        assert state is not None
        outcome = {"ok": "replica", "unchecked": "down", "down": "down"}.get(
            state.status, state.status
        )
        wrote = self._wrote.get(token_id) if token_id is not None else None
        if outcome == "replica" and wrote is not None and wrote > self._fresh_as_of:
            if self._checked_at < wrote:
                self.check()  # measured before the write: measure again, it may be through
            if self._down:
                outcome = "down"
            elif wrote > self._fresh_as_of:
                outcome = "own_write"
        return (self.replica if outcome == "replica" else self.primary), outcome

    @contextmanager
    def connect(self, token_id: int | None = None, *, costs: bool = False) -> Iterator[Connection]:
        """A connection for a read by ``token_id`` (``costs``: one that sums costs): the
        replica's if the rule allows, else (and whenever the replica fails to connect) the
        primary's."""
        engine, outcome = self.route(token_id, costs=costs)
        conn: Connection | None = None
        if engine is self.replica:
            try:
                conn = engine.connect()
            except OUTAGE_ERRORS as exc:
                self._failed(exc)
                outcome, engine = "down", self.primary
        if self.replica is not None:
            self._metrics.reads.labels(outcome).inc()
        with conn if conn is not None else engine.connect() as opened:
            try:
                yield opened
            except OUTAGE_ERRORS as exc:
                if engine is self.replica and opened.invalidated:
                    self._failed(exc)  # the replica went away mid-read: the next reads skip it
                raise
