"""The agent loop: poll the backend, attribute processes to jobs, spool, ship.

One thread does it all, once per interval. Each poll is written to the on-disk spool as it is
taken, then shipped from there: the spool drains oldest first, several polls per request, and
central's answers are handled by the delivery table of ``service.delivery`` (credentials kept,
bad content split poll by poll, busy retried, a batch central fails on set aside behind newer
ones). A backend that fails as a whole is closed and re-opened with backoff.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path

from service.clock import Clock, utc_now
from service.collectors.attribution import JobAttributor
from service.collectors.backend import Backend, BackendError, Device, ProcessReading, Snapshot
from service.collectors.batch import (
    build_batch,
    decode,
    gzip_body,
    join_polls,
    poll_json,
    raw_json,
    split_to_limits,
)
from service.collectors.host_proc import read_hosts
from service.collectors.job_ends import collect_job_ends, ship_job_ends
from service.collectors.plausible import drop_implausible, drop_implausible_processes
from service.collectors.shipper import Reply, Shipper
from service.collectors.spool import Entry, Spool
from service.collectors.telemetry import AgentTelemetry
from service.delivery import (
    Action,
    Backoff,
    Decision,
    LogThrottle,
    Refusal,
    RetryPolicy,
    decide,
    parse_retry_after,
    rfc3339,
)
from service.wire import MAX_BATCH_PROCESSES, MAX_BATCH_SAMPLES, IngestResult

log = logging.getLogger(__name__)


@dataclass
class AgentConfig:
    """What the loop needs beyond its collaborators: node identity, cadence and files."""

    hostname: str
    labels: Mapping[str, str]
    dead_letter_path: Path  # in the state directory (state_dir.py); never a relative default
    interval_seconds: float = 10.0
    drain_budget_fraction: float = 0.8  # of an interval, spent shipping from the spool at most
    batch_cycles: int = 1  # polls per shipped batch (one HTTP request per batch)
    max_polls_per_request: int = 60  # when catching up, within central's per-batch limits too
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    job_end_dir: Path | None = None  # job ends the Slurm epilog left for this agent to ship


class Agent:
    """Collects from one backend and delivers every poll once, through the on-disk spool."""

    def __init__(
        self,
        *,
        config: AgentConfig,
        backend: Backend,
        shipper: Shipper,
        spool: Spool,
        telemetry: AgentTelemetry | None = None,
        attributor: JobAttributor | None = None,
        clock: Clock = utc_now,
        monotonic: Callable[[], float] = time.monotonic,
        backend_backoff: Backoff | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        self.shipper = shipper
        self.spool = spool
        self.telemetry = telemetry or AgentTelemetry()
        self.attributor = attributor
        self.clock = clock
        self.monotonic = monotonic
        self.rng = rng or random.Random()
        self._ship_failures = 0  # refused attempts in a row, whatever the poll: sets the wait
        self.backend_backoff = backend_backoff or Backoff(base_seconds=2.0, cap_seconds=120.0)
        self._next_ship_at = 0.0
        self._next_backend_at = 0.0
        self._devices: list[Device] = []
        self._stop = threading.Event()
        self._said = LogThrottle(60.0)
        self._dropped_seen: set[tuple[str, str]] = set()
        self.dead_letters = 0
        self._sync_spool_gauges()

    # --- collection -------------------------------------------------------------------
    def poll(self, now: datetime | None = None) -> Snapshot | None:
        """Poll the backend once, drop impossible values, attribute processes; None on failure."""
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
        self._drop_implausible(snap)
        self._attribute(snap, devices)
        if self.attributor is not None:
            # The host side of each GPU process, from the /proc tree attribution reads.
            read_hosts(snap.processes, self.attributor.proc_root)
        lost = sum(1 for d in devices if d.lost)
        retired = sum(1 for d in devices if d.retired)
        t.gpus.labels("ok").set(len(devices) - lost - retired)
        t.gpus.labels("lost").set(lost)
        t.samples.inc(len(snap.readings))
        return snap

    def take(self, snap: Snapshot) -> None:
        """Write one poll to the spool now (split to central's limits), so a crash keeps it."""
        batch = build_batch(
            hostname=self.config.hostname,
            labels=self.config.labels,
            devices=self._devices,
            snapshots=[snap],
        )
        at = snap.ts.timestamp()
        for part in split_to_limits(batch):
            dropped = self.spool.push(
                gzip_body(poll_json(part)),
                now=at,
                samples=len(part["samples"]),
                processes=len(part["processes"]),
            )
            if dropped:
                self.telemetry.dropped.inc(dropped)
                log.warning("spool full: dropped the %d oldest poll(s)", dropped)
        self._sync_spool_gauges()

    def _drop_implausible(self, snap: Snapshot) -> None:
        for d in drop_implausible(snap.readings) + drop_implausible_processes(snap.processes):
            self.telemetry.dropped_fields.labels(d.field, d.reason).inc()
            if (d.gpu_uuid, d.field) not in self._dropped_seen:
                self._dropped_seen.add((d.gpu_uuid, d.field))
                log.warning(
                    "GPU %s reported %s = %r (%s): dropped from its sample; the rest ships"
                    " (said once per GPU and field, counted in"
                    " gpuwarden_agent_dropped_fields_total)",
                    d.gpu_uuid,
                    d.field,
                    d.value,
                    d.reason,
                )

    def _attribute(self, snap: Snapshot, devices: list[Device]) -> None:
        a = self.attributor
        if a is None:
            return
        a.refresh(devices)
        # The kubelet names a MIG instance by NVML's MIG-<uuid>, GPU Warden by its own identity.
        kubelet_id = {d.uuid: d.alias for d in devices if d.alias}
        alive: set[int] = set()
        seen_jobs: dict[str, set[str]] = {}
        for p in snap.processes:
            if p.job_id is None and p.pid > 0:
                alive.add(p.pid)
                found = a.attribute(p.pid, p.gpu_index, kubelet_id.get(p.gpu_uuid, p.gpu_uuid))
                p.job_id = found.job_id
                p.user = p.user or found.user
            if p.job_id is not None:
                seen_jobs.setdefault(p.gpu_uuid, set()).add(p.job_id)
        a.forget_except(alive)
        if not a.reports_held_gpus:
            return
        # A job can hold a GPU without running anything on it: that is the waste we look for,
        # so a pod's allocation or the mapping directory's assignment is reported even with no
        # process (pid 0), for every pod of a GPU several pods share: each is a tenant.
        for d in devices:
            if d.lost or d.retired:
                continue
            for job in a.device_jobs(d.alias or d.uuid, d.index):
                if job not in seen_jobs.get(d.uuid, ()):
                    snap.processes.append(ProcessReading(gpu_uuid=d.uuid, pid=0, job_id=job))

    # --- delivery ---------------------------------------------------------------------
    def ship(self, budget_seconds: float, *, whole: bool = False) -> int:
        """Ship spooled polls oldest first until none is due, a refusal, or the budget is spent.

        Polls go ``batch_cycles`` to a request (more when catching up); with ``whole`` a short
        batch goes too. Returns how many polls central took.
        """
        cfg = self.config
        sent = 0
        deadline = self.monotonic() + budget_seconds
        while self.monotonic() >= self._next_ship_at:
            now = self.clock().timestamp()
            oldest = self.spool.oldest_created_at()
            if oldest is None:
                break
            window = cfg.batch_cycles * cfg.interval_seconds
            if self.spool.depth < cfg.batch_cycles and not whole and now - oldest < window:
                break  # a fuller batch comes with the next polls (no need to read the spool)
            due = self.spool.due(now=now, limit=max(cfg.max_polls_per_request, cfg.batch_cycles))
            if not due:
                break
            if len(due) < cfg.batch_cycles and not whole and now - due[0].created_at < window:
                break  # a fuller batch comes with the next polls
            taken, go_on = self._send(self._group(due))
            sent += taken
            if not go_on or self.monotonic() >= deadline:
                break
        self._sync_spool_gauges()
        return sent

    def _group(self, due: list[Entry]) -> list[Entry]:
        """The oldest due polls that fit one request; one set aside, or of unknown size, alone."""
        limit = self.config.retry.server_error_limit
        first = due[0]
        if first.server_errors >= limit or first.samples < 0:
            return [first]
        group: list[Entry] = []
        samples = processes = 0
        for e in due:
            if e.server_errors >= limit or e.samples < 0:
                break
            samples += e.samples
            processes += e.processes
            if group and (samples > MAX_BATCH_SAMPLES or processes > MAX_BATCH_PROCESSES):
                break
            group.append(e)
        return group

    def _send(self, group: list[Entry]) -> tuple[int, bool]:
        """One attempt at ``group`` by the delivery table: (polls taken, whether to go on)."""
        if len(group) == 1:
            body = group[0].body  # gzip already, as spooled
        else:
            body = gzip_body(join_polls([raw_json(e.body) for e in group]))
        reply = self.shipper.send(body)
        now = self.clock()
        worst = max(e.server_errors for e in group)
        d = decide(
            reply.status,
            parts=len(group),
            failures=self._ship_failures,
            server_errors=worst,
            retry_after_seconds=parse_retry_after(reply.retry_after, now=now),
            policy=self.config.retry,
            rng=self.rng,
        )
        ids = [e.id for e in group]
        t = self.telemetry
        if d.action is Action.SENT:
            self.spool.remove(ids)
            self._ship_failures = 0
            self._next_ship_at = 0.0
            t.sent.inc()
            t.last_push.set(now.timestamp())
            self._say_claims(reply)
            return len(group), True
        t.errors.labels(_error_kind(reply, d)).inc()
        if d.refusal is Refusal.SERVER:
            aside = now.timestamp() + d.delay_seconds if d.action is Action.SET_ASIDE else 0.0
            self.spool.note_server_errors(ids, d.server_errors, not_before=aside)
        if d.action is Action.SPLIT:
            t.splits.inc()
            taken = 0
            for e in group:
                errors = d.server_errors if d.refusal is Refusal.SERVER else e.server_errors
                got, go_on = self._send([replace(e, server_errors=errors)])
                taken += got
                if not go_on:
                    return taken, False
            return taken, True
        if d.action is Action.DEAD_LETTER:
            self._dead_letter(body, reply)
            self.spool.remove(ids)
            return 0, True
        self._ship_failures += 1
        if d.action is Action.SET_ASIDE:
            t.set_aside.inc()
            if self._said.due("set_aside", self.monotonic()):
                log.warning(
                    "central answered %s to the poll of %s %d times in a row; set aside for"
                    " %.0f s behind newer polls, then tried again, never dropped (said once a"
                    " minute; gpuwarden_agent_set_aside_batches_total counts them all): %s",
                    reply.status,
                    rfc3339(datetime.fromtimestamp(group[0].created_at, now.tzinfo)),
                    d.server_errors,
                    d.delay_seconds,
                    reply.message[:300],
                )
            return 0, True
        self._next_ship_at = self.monotonic() + d.delay_seconds
        self._say_refused(reply, d)
        return 0, False

    def _say_claims(self, reply: Reply) -> None:
        """Log what central said of GPUs another node owned: moved here, or left out."""
        try:
            claims = IngestResult.model_validate_json(reply.message).gpu_claims
        except ValueError:
            return  # an answer from an older central, or cut short: nothing to say
        for claim in claims:
            if claim.moved:
                log.warning("central: %s", claim.reason)
            elif self._said.due(f"left_out:{claim.gpu_uuid}", self.monotonic()):
                log.warning("central stored this batch without one GPU: %s", claim.reason)

    def _say_refused(self, reply: Reply, d: Decision) -> None:
        """Log a refusal that holds everything back, once a minute per kind."""
        assert d.refusal is not None
        if not self._said.due(d.refusal.value, self.monotonic()):
            return
        if d.refusal is Refusal.CREDENTIALS:
            log.error(
                "central refused this agent's credentials (%s %s): check the agent token and the"
                " node name (%s) it was made for; keeping %d poll(s) in the spool, next try in"
                " %.0f s",
                reply.status,
                reply.message[:200],
                self.config.hostname,
                self.spool.depth,
                d.delay_seconds,
            )
        else:
            log.warning(
                "central service unavailable (%s %s); keeping %d poll(s), next try in %.1f s",
                reply.status or "no answer:",
                reply.message[:200],
                self.spool.depth,
                d.delay_seconds,
            )

    def _dead_letter(self, body: bytes, reply: Reply) -> None:
        t = self.telemetry
        t.dead_letters.inc()
        t.errors.labels("dead_letter").inc()
        self.dead_letters += 1
        log.error(
            "central service refused a poll with %s: %s (written to %s)",
            reply.status,
            reply.message[:500],
            self.config.dead_letter_path,
        )
        try:
            batch: object = decode(body)
        except Exception:  # keep the raw size at least; the file is for humans
            batch = {"undecodable_bytes": len(body)}
        line = json.dumps(
            {
                "at": rfc3339(self.clock()),
                "status": reply.status,
                "message": reply.message,
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
        """One cycle: poll and spool, then ship what is due."""
        started = time.perf_counter()
        try:
            snap = self.poll()
            if snap is not None:
                self.take(snap)
            self.ship(self.config.interval_seconds * self.config.drain_budget_fraction)
            self.collect_job_ends()
            self.ship_job_ends()
        except Exception:  # the loop must survive anything one cycle throws
            self.telemetry.errors.labels("cycle").inc()
            log.exception("agent cycle failed")
        finally:
            self.telemetry.cycle_seconds.observe(time.perf_counter() - started)
            self.telemetry.cycle_done()

    def collect_job_ends(self) -> int:
        """Move the job ends the Slurm epilog left into the spool; returns how many."""
        return collect_job_ends(self.config.job_end_dir, self.spool, now=self.clock().timestamp())

    def ship_job_ends(self) -> int:
        """Send the spooled job ends to central; returns how many it took."""
        return ship_job_ends(self.spool, self.shipper, self._said, self.monotonic)

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

    def flush(self, budget_seconds: float | None = None) -> int:
        """Ship every due poll now, a short batch too; returns how many central took."""
        if budget_seconds is None:
            budget_seconds = self.config.interval_seconds * self.config.drain_budget_fraction
        return self.ship(budget_seconds, whole=True)

    def close(self) -> None:
        """Try once more to ship what is due (it stays spooled if not), then release all."""
        try:
            self.flush()
        except Exception:
            log.exception("could not ship the last polls")
        self.backend.close()
        self.shipper.close()
        self.spool.close()


def _error_kind(reply: Reply, d: Decision) -> str:
    """The ``kind`` label of gpuwarden_agent_errors_total for a refused attempt."""
    if reply.status is None:
        return "ship_network"
    return f"ship_{d.refusal}"


def backfill(
    agent: Agent, *, start: datetime, end: datetime, step_seconds: float, per_batch: int
) -> int:
    """Poll at past times from ``start`` to ``end`` (simulated history), ship; returns polls."""
    polls = 0
    ts = start
    while ts < end:
        snap = agent.poll(ts)
        if snap is not None:
            agent.take(snap)
            polls += 1
            if polls % per_batch == 0:
                agent.flush(budget_seconds=60.0)
        ts += timedelta(seconds=step_seconds)
    agent.flush(budget_seconds=60.0)
    return polls
