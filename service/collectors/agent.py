"""The agent loop: poll the backend, attribute processes to jobs, batch, ship or spool.

One thread does it all, once per interval. Delivery is in order: while anything waits in the
spool, new batches queue behind it, and the spool drains oldest first as soon as the central
service answers again. A backend that fails as a whole is closed and re-opened with backoff.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from service.collectors.attribution import JobAttributor
from service.collectors.backend import Backend, BackendError, Device, ProcessReading, Snapshot
from service.collectors.batch import build_batch, decode, encode, rfc3339
from service.collectors.shipper import Backoff, Outcome, Result, Shipper
from service.collectors.spool import Spool
from service.collectors.telemetry import AgentTelemetry

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class AgentConfig:
    """What the loop needs beyond its collaborators: node identity, cadence and files."""

    hostname: str
    labels: Mapping[str, str]
    interval_seconds: float = 10.0
    dead_letter_path: Path = Path("gpuwarden-dead-letter.jsonl")
    drain_budget_fraction: float = 0.8  # of an interval, spent replaying the spool at most
    batch_cycles: int = 1  # polls per shipped batch (one HTTP request per batch)


class Agent:
    """Collects from one backend and delivers every batch exactly once, in order, or spools it."""

    def __init__(
        self,
        *,
        config: AgentConfig,
        backend: Backend,
        shipper: Shipper,
        spool: Spool,
        telemetry: AgentTelemetry | None = None,
        attributor: JobAttributor | None = None,
        clock: Clock = _utc_now,
        monotonic: Callable[[], float] = time.monotonic,
        ship_backoff: Backoff | None = None,
        backend_backoff: Backoff | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        self.shipper = shipper
        self.spool = spool
        self.telemetry = telemetry or AgentTelemetry()
        self.attributor = attributor
        self.clock = clock
        self.monotonic = monotonic
        self.ship_backoff = ship_backoff or Backoff()
        self.backend_backoff = backend_backoff or Backoff(base_seconds=2.0, cap_seconds=120.0)
        self._next_ship_at = 0.0
        self._next_backend_at = 0.0
        self._devices: list[Device] = []
        self._pending: list[Snapshot] = []  # polls not yet shipped: all a kill -9 can lose
        self._stop = threading.Event()
        self.dead_letters = 0
        self.last_result: Result | None = None
        self._sync_spool_gauges()

    # --- collection -------------------------------------------------------------------
    def collect(self, now: datetime | None = None) -> bytes | None:
        """Poll the backend once and return the encoded batch, or None if the backend failed."""
        snap = self.poll(now)
        return None if snap is None else self.encode([snap])

    def poll(self, now: datetime | None = None) -> Snapshot | None:
        """Poll the backend once and attribute processes; None if the backend failed."""
        t = self.telemetry
        mono = self.monotonic()
        if mono < self._next_backend_at:
            return None
        ts = now or self.clock()
        try:
            snap = self.backend.sample(ts)
            devices = self.backend.devices()
        except BackendError as exc:
            t.errors.labels("backend").inc()
            delay = self.backend_backoff.next_delay()
            self._next_backend_at = mono + delay
            log.error("backend %s failed (%s); retrying in %.1f s", self.backend.name, exc, delay)
            self.backend.close()
            return None
        self.backend_backoff.reset()
        self._devices = devices
        self._attribute(snap, devices)
        lost = sum(1 for d in devices if d.lost)
        t.gpus.labels("ok").set(len(devices) - lost)
        t.gpus.labels("lost").set(lost)
        t.samples.inc(len(snap.readings))
        return snap

    def encode(self, snapshots: list[Snapshot]) -> bytes:
        """The gzipped wire batch of ``snapshots`` with this node's devices."""
        batch = build_batch(
            hostname=self.config.hostname,
            labels=self.config.labels,
            devices=self._devices,
            snapshots=snapshots,
        )
        return encode(batch)

    def _attribute(self, snap: Snapshot, devices: list[Device]) -> None:
        a = self.attributor
        if a is None:
            return
        alive: set[int] = set()
        seen_jobs: dict[str, set[str]] = {}
        for p in snap.processes:
            if p.job_id is None and p.pid > 0:
                alive.add(p.pid)
                found = a.attribute(p.pid, p.gpu_index)
                p.job_id = found.job_id
                p.user = p.user or found.user
            if p.job_id is not None:
                seen_jobs.setdefault(p.gpu_uuid, set()).add(p.job_id)
        a.forget_except(alive)
        if a.job_map_dir is None:
            return
        # A job can hold a GPU without running anything on it: that is the waste we look for,
        # so the mapping directory's assignment is reported even with no process (pid 0).
        for d in devices:
            if d.lost:
                continue
            job = a.mapped_job(d.index)
            if job is not None and job not in seen_jobs.get(d.uuid, ()):
                snap.processes.append(ProcessReading(gpu_uuid=d.uuid, pid=0, job_id=job))

    # --- delivery ---------------------------------------------------------------------
    def deliver(self, body: bytes) -> None:
        """Send ``body`` now if nothing is queued and the backoff allows, else spool it."""
        if self.spool.depth == 0 and self.monotonic() >= self._next_ship_at:
            result = self._attempt(body)
            if result.outcome is not Outcome.RETRY:
                return
        dropped = self.spool.push(body)
        if dropped:
            self.telemetry.dropped.inc(dropped)
            log.warning("spool full: dropped the %d oldest batch(es)", dropped)
        self._sync_spool_gauges()

    def drain(self, budget_seconds: float) -> int:
        """Replay spooled batches oldest first until empty, a failure, or the budget is spent."""
        sent = 0
        deadline = self.monotonic() + budget_seconds
        while self.spool.depth and self.monotonic() >= self._next_ship_at:
            item = self.spool.oldest()
            if item is None:
                break
            batch_id, body = item
            result = self._attempt(body)
            if result.outcome is Outcome.RETRY:
                break
            self.spool.remove(batch_id)
            sent += 1
            if self.monotonic() >= deadline:
                break
        self._sync_spool_gauges()
        return sent

    def _attempt(self, body: bytes) -> Result:
        t = self.telemetry
        result = self.shipper.send(body)
        self.last_result = result
        if result.outcome is Outcome.SENT:
            self.ship_backoff.reset()
            self._next_ship_at = 0.0
            t.sent.inc()
            t.last_push.set(time.time())
        elif result.outcome is Outcome.RETRY:
            kind = (
                "ship_network"
                if result.status is None
                else ("ship_429" if result.status == 429 else "ship_5xx")
            )
            t.errors.labels(kind).inc()
            delay = self.ship_backoff.next_delay(result.retry_after_seconds)
            self._next_ship_at = self.monotonic() + delay
            log.warning(
                "central service unavailable (%s %s); next try in %.1f s",
                result.status or "",
                result.message[:200],
                delay,
            )
        else:
            self._dead_letter(body, result)
        return result

    def _dead_letter(self, body: bytes, result: Result) -> None:
        t = self.telemetry
        t.dead_letters.inc()
        t.errors.labels("dead_letter").inc()
        self.dead_letters += 1
        log.error(
            "central service refused a batch with %s: %s (written to %s)",
            result.status,
            result.message[:500],
            self.config.dead_letter_path,
        )
        try:
            batch: object = decode(body)
        except Exception:  # keep the raw size at least; the file is for humans
            batch = {"undecodable_bytes": len(body)}
        line = json.dumps(
            {
                "at": rfc3339(self.clock()),
                "status": result.status,
                "message": result.message,
                "batch": batch,
            }
        )
        try:
            with open(self.config.dead_letter_path, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")
        except OSError as exc:
            t.errors.labels("dead_letter_write").inc()
            log.error("cannot write dead-letter file: %s", exc)

    def _sync_spool_gauges(self) -> None:
        self.telemetry.spool_batches.set(self.spool.depth)
        self.telemetry.spool_bytes.set(self.spool.bytes)

    # --- the loop ---------------------------------------------------------------------
    def run_once(self) -> None:
        """One cycle: replay what is spooled, collect, deliver."""
        started = time.perf_counter()
        budget = self.config.interval_seconds * self.config.drain_budget_fraction
        try:
            if self.spool.depth:
                self.drain(budget)
            snap = self.poll()
            if snap is not None:
                self._pending.append(snap)
            if len(self._pending) >= self.config.batch_cycles:
                self.flush()
        except Exception:  # the loop must survive anything one cycle throws
            self.telemetry.errors.labels("cycle").inc()
            log.exception("agent cycle failed")
        finally:
            self.telemetry.cycle_seconds.observe(time.perf_counter() - started)

    def run_forever(self) -> None:
        """Run cycles every interval until ``stop()``; the schedule does not drift."""
        interval = self.config.interval_seconds
        next_at = self.monotonic()
        while not self._stop.is_set():
            self.run_once()
            next_at += interval
            now = self.monotonic()
            if next_at < now:  # a slow cycle: skip missed slots rather than burst
                next_at = now + interval
            self._stop.wait(next_at - now)

    def stop(self) -> None:
        """Ask ``run_forever`` to return after the current cycle."""
        self._stop.set()

    def flush(self) -> None:
        """Deliver (or spool) the polls held in memory as one batch."""
        if self._pending:
            pending, self._pending = self._pending, []
            self.deliver(self.encode(pending))

    def close(self) -> None:
        """Deliver or spool what is held in memory, then release backend, HTTP and spool."""
        try:
            self.flush()
        except Exception:
            log.exception("could not flush the last batch")
        self.backend.close()
        self.shipper.close()
        self.spool.close()


def backfill(
    agent: Agent, *, start: datetime, end: datetime, step_seconds: float, per_batch: int
) -> int:
    """Poll at past times from ``start`` to ``end`` (simulated history), deliver; returns polls."""
    polls = 0
    chunk: list[Snapshot] = []
    ts = start
    while ts < end:
        snap = agent.poll(ts)
        if snap is not None:
            chunk.append(snap)
            polls += 1
        if len(chunk) >= per_batch:
            agent.deliver(agent.encode(chunk))
            chunk = []
        ts += timedelta(seconds=step_seconds)
    if chunk:
        agent.deliver(agent.encode(chunk))
    return polls
