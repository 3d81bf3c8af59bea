"""Delivery of queued notifications, written once around every notifier.

Each refused attempt follows the delivery table of ``service.delivery``, as the agent's batches
do: credentials refused (401/403) or a redirect: kept and retried with backoff, logged once a
minute, never failed; other 4xx: failed (the dead letter of a notification); 408/429/503 and
network errors: retried without limit, honouring Retry-After; other 5xx: retried, and after a
few in a row set aside for longer while newer notifications go first; never dropped. A
per-channel rate limit spaces messages; each outcome is counted in /metrics.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Annotated, Any, Literal, assert_never

import httpx
from pydantic import Field, TypeAdapter, ValidationError

from service.context import ServiceContext
from service.db import notices_repo, outbox_repo, policies_repo, set_aside
from service.db.rows import NewOutboxRow
from service.db.set_aside import SetAside
from service.delivery import (
    Action,
    LogThrottle,
    Refusal,
    RetryPolicy,
    decide,
    parse_retry_after,
)
from service.errors import DeliveryError, ValidationFailed
from service.notify import Notification, notifier_for, send_envelope
from service.notify.egress import egress_from
from service.notify.envelope import Envelope
from service.notify.pinned import make_client
from service.notify.ratelimit import RateLimiter
from service.notify.report import ReportMessage, send_report
from service.notify.urlsafety import (
    IPNetwork,
    Resolver,
    parse_allow_nets,
    resolve_checked,
    system_resolver,
)
from service.thresholds.policy import ChannelSpec

log = logging.getLogger(__name__)

KEEP_DAYS = 7  # sent and failed deliveries are kept this long for inspection
PRUNE_EVERY_SECONDS = 3600.0
RETRY_POLICY = RetryPolicy(base_seconds=2.0, cap_seconds=600.0)
# A notifier's unexpected exception is a bug or a message no notifier can send, not the
# receiver's state: a few tries a minute apart ride out a passing fault (a rotated config file
# read half-written), and after that each try only repeats the failure, so the delivery is set
# aside as failed with its reason rather than retried (and logged) forever.
INTERNAL_ERROR_ATTEMPTS = 5
INTERNAL_ERROR = "internal error"  # how a delivery's last_error starts after such a try
INTERNAL_ERROR_RETRY_SECONDS = 60.0
# What an outbox row holds, told apart by its ``kind``: a periodic report ("report"), a
# rendered message ("message"), else an alert's notification (its NotifyKind, "test", "notice").
# How one delivery attempt ended, as counted in /metrics.
Attempt = Literal["sent", "retry", "failed"]
OutboxPayload = Annotated[Notification | ReportMessage | Envelope, Field(discriminator="kind")]
OUTBOX_PAYLOAD: TypeAdapter[Notification | ReportMessage | Envelope] = TypeAdapter(OutboxPayload)


def outbox_row(note: Notification, *, channel: str, alert_id: int | None) -> NewOutboxRow:
    """The outbox row of ``note`` to ``channel`` under a new delivery id: its payload is the
    notification's JSON, as ``Dispatcher`` reads it back."""
    delivery_id = f"msg_{uuid.uuid4().hex}"
    addressed = note.model_copy(update={"delivery_id": delivery_id})
    return {
        "delivery_id": delivery_id,
        "channel": channel,
        "alert_id": alert_id,
        "payload": addressed.model_dump(mode="json"),
    }


class Dispatcher:
    """Sends what is due in the outbox; one drain at a time per process."""

    def __init__(
        self,
        ctx: ServiceContext,
        *,
        client: httpx.Client | None = None,
        resolver: Resolver = system_resolver,
        rng: random.Random | None = None,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ctx = ctx
        # Our own client checks each address as it connects; an injected one gets the check
        # before each send (and leaves the resolve-to-connect gap to whoever injected it).
        self._checks_itself = client is None
        self.client = client or make_client(
            ctx.settings.notify_timeout_seconds,
            self.allow_nets,
            resolver=resolver,
            admit_url=ctx.settings.local_sink_url,
            egress=egress_from(ctx.settings.notify_proxy_url, os.environ),
        )
        self.resolver = resolver
        self.rng = rng or random.Random()
        self.sleep = sleep
        self.monotonic = monotonic
        self.limiter = RateLimiter()
        self._lock = threading.Lock()
        self._pruned_at: float | None = None
        self._said = LogThrottle(60.0)

    def allow_nets(self) -> list[IPNetwork]:
        """The networks GPUWARDEN_WEBHOOK_ALLOW_NETS admits, read at each send."""
        return parse_allow_nets(self.ctx.settings.webhook_allow_nets)

    def send_now(self, channel: ChannelSpec, note: Notification | ReportMessage | Envelope) -> None:
        """Send one notification, report or rendered message to a checked address, raising
        ValidationFailed or DeliveryError."""
        if not self._checks_itself and channel.is_http:
            resolve_checked(
                channel.url,
                self.allow_nets(),
                resolver=self.resolver,
                admit_url=self.ctx.settings.local_sink_url,
            )
        match note:
            case ReportMessage():
                send_report(channel, self.client, note)
            case Envelope():
                send_envelope(channel, self.client, self.ctx.settings, note)
            case Notification():
                notifier_for(channel, self.client, self.ctx.settings).send(note)
            case _:
                assert_never(note)

    def drain(self, *, budget_seconds: float = 5.0, limit: int = 200) -> int:
        """Send every due delivery (within ``budget_seconds`` of rate-limit waits); returns sent."""
        with self._lock:
            return self._drain(budget_seconds, limit)

    def _drain(self, budget_seconds: float, limit: int) -> int:
        ctx, tel = self.ctx, self.ctx.telemetry
        started = self.monotonic()
        with ctx.engine.begin() as conn:
            rows = outbox_repo.due(conn, now=ctx.clock(), limit=limit)
            chans = {c.name: c for c in policies_repo.list_channels(conn)}
        sent = 0
        deferred: set[str] = set()
        for row in rows:
            channel = chans.get(row.channel)
            if row.channel in deferred:
                continue
            if channel is None:
                self._record(row, "failed", f"channel {row.channel!r} no longer exists")
                continue
            wait = self.limiter.wait_seconds(
                channel.name, channel.messages_per_second, self.monotonic()
            )
            if wait > 0:
                if self.monotonic() - started + wait > budget_seconds:
                    deferred.add(channel.name)  # the next drain picks these up, in order
                    continue
                self.sleep(wait)
            note = self._readable(row)
            if note is None:
                continue
            self.limiter.take(channel.name, self.monotonic())
            try:
                self.send_now(channel, note)
            except ValidationFailed as exc:
                self._record(row, "failed", str(exc))
            except DeliveryError as exc:
                self._refused(row, exc)
            except Exception as exc:  # a notifier bug must not stop the others
                self._internal_error(row, exc)
            else:
                self._record(row, "sent", None)
                sent += 1
        if self._pruned_at is None or self.monotonic() - self._pruned_at > PRUNE_EVERY_SECONDS:
            with ctx.engine.begin() as conn:
                outbox_repo.prune(conn, before=ctx.clock() - timedelta(days=KEEP_DAYS))
                keep_notices = timedelta(days=ctx.settings.notices_retention_days)
                notices_repo.prune(conn, before=ctx.clock() - keep_notices)
            self._pruned_at = self.monotonic()
        with ctx.engine.connect() as conn:
            tel.outbox_depth.set(outbox_repo.depth(conn))
        return sent

    def _readable(self, row: outbox_repo.Due) -> Notification | ReportMessage | Envelope | None:
        """The notification, report or rendered message ``row`` holds, or None when it holds
        none: then it is failed at once, logged and counted as set aside (retrying cannot make
        it readable)."""
        reason = row.unreadable
        if reason is None:
            try:
                return OUTBOX_PAYLOAD.validate_python(row.payload)
            except ValidationError as exc:
                reason = f"payload is not a notification ({exc.error_count()} errors)"
        self._record(row, "failed", reason, quiet=True)
        found = [SetAside("deliver", f"delivery {row.delivery_id} to {row.channel}", reason)]
        set_aside.report(found, counter=self.ctx.telemetry.set_aside_rows, log=log)
        return None

    def _internal_error(self, row: outbox_repo.Due, exc: Exception) -> None:
        """Retry a delivery whose notifier raised unexpectedly, a minute apart, and set it aside
        as failed on its INTERNAL_ERROR_ATTEMPTS-th try (counting every try); the traceback is
        logged at the first such error only (the same one each time), the later tries in one
        line."""
        attempt = row.attempts + 1
        said = " ".join(str(exc).split())[:200]  # one line: the error may quote the message
        reason = f"{INTERNAL_ERROR}: {type(exc).__name__}" + (f": {said}" if said else "")
        if not (row.last_error or "").startswith(INTERNAL_ERROR):
            log.exception("sending delivery %s failed unexpectedly", row.delivery_id)
        if attempt < INTERNAL_ERROR_ATTEMPTS:
            self._record(row, "retry", reason, INTERNAL_ERROR_RETRY_SECONDS)
            return
        reason += f" (attempt {attempt} of {INTERNAL_ERROR_ATTEMPTS}: set aside)"
        self._record(row, "failed", reason, quiet=True)
        found = [SetAside("deliver", f"delivery {row.delivery_id} to {row.channel}", reason)]
        set_aside.report(found, counter=self.ctx.telemetry.set_aside_rows, log=log)

    def _refused(self, row: Any, exc: DeliveryError) -> None:
        """Apply the delivery table to a refused attempt (a notification is one part)."""
        d = decide(
            exc.status,
            parts=1,
            failures=row.attempts,
            server_errors=row.attempts,
            retry_after_seconds=parse_retry_after(exc.retry_after, now=self.ctx.clock()),
            policy=RETRY_POLICY,
            rng=self.rng,
        )
        if d.action is Action.DEAD_LETTER:
            self._record(row, "failed", str(exc))
            return
        keep = d.refusal is Refusal.CREDENTIALS
        if keep and self._said.due(row.channel, self.monotonic()):
            log.error(
                "channel %s refused GPU Warden's credentials or redirected (%s): its"
                " notifications are kept and retried with backoff until the channel's URL or"
                " secret is fixed (said once a minute)",
                row.channel,
                exc,
            )
        self._record(row, "retry", str(exc), d.delay_seconds, quiet=keep)

    def _record(
        self,
        row: Any,
        outcome: Attempt,
        error: str | None,
        delay: float = 0.0,
        *,
        quiet: bool = False,
    ) -> None:
        """Store one attempt's outcome in its own transaction and count it."""
        now = self.ctx.clock()
        with self.ctx.engine.begin() as conn:
            # A message to a person is recorded beside the outbox, which forgets after a week.
            notices_repo.mark(
                conn,
                delivery_id=row.delivery_id,
                status="pending" if outcome == "retry" else outcome,
                error=error,
                now=now,
            )
            match outcome:
                case "sent":
                    outbox_repo.mark_sent(conn, row_id=row.id, now=now)
                case "retry":
                    outbox_repo.mark_retry(
                        conn,
                        row_id=row.id,
                        error=error or "",
                        next_attempt_at=now + timedelta(seconds=delay),
                    )
                case "failed":
                    outbox_repo.mark_failed(conn, row_id=row.id, error=error or "")
                case _:
                    assert_never(outcome)
        self.ctx.telemetry.notifications.labels(row.channel, outcome).inc()
        if outcome != "sent" and not quiet:
            # The error text names the channel and status, never its URL or secret.
            log.warning(
                "delivery %s to channel %s: %s (%s)", row.delivery_id, row.channel, outcome, error
            )
