"""Action webhook driver: POST a signed JSON action document, for any system a site reclaims
GPUs in itself (a batch scheduler of its own, a cloud API, a ticket).

The document is a Standard Webhooks payload signed as the webhook notifier signs (webhook-id,
webhook-timestamp, webhook-signature), with the ``whsec_`` secret
(GPUWARDEN_ACTION_WEBHOOK_URL and GPUWARDEN_ACTION_WEBHOOK_SECRET); ``webhook-id`` is
the step's idempotency key, the same on every retry of one step, so a receiver acts once. The
URL is called as notification channels are: only addresses GPUWARDEN_WEBHOOK_ALLOW_NETS admits
besides public ones, resolved and checked per request, redirects never followed.

Answers, by the delivery table's rows (service.delivery): 2xx reclaimed; 404 and 410 gone (the
receiver no longer knows the job); anything else, or no answer, failed with the row's reason,
tried again on a later round of the ladder.
"""

from __future__ import annotations

import hashlib
from typing import Any

import httpx

from service.actions.base import ReclaimResult, ReclaimTarget
from service.clock import Clock, utc_now
from service.delivery import Refusal, refusal, rfc3339
from service.errors import DeliveryError, ValidationFailed
from service.notify.base import dumps, post_json
from service.notify.webhook import signature_headers
from service.thresholds.policy import ChannelSpec

ACTION_TYPE = "action.reclaim"
MODES = ("reclaim",)
GONE_STATUSES = (404, 410)
_WHY = {
    Refusal.CREDENTIALS: "refused our credentials or redirected: check the secret and URL",
    Refusal.CONTENT: "refused the document",
    Refusal.BUSY: "busy or unreachable",
    Refusal.SERVER: "server error",
}


def idempotency_key(target: ReclaimTarget) -> str:
    """The step's key: the ladder's own when it gives one, else one made of the policy, job and
    mode (the same for every retry, and for a later ladder on the same job: give one)."""
    if target.idempotency_key:
        return target.idempotency_key
    seed = "\x1f".join((target.policy or "", target.job_id, target.mode))
    return "act_" + hashlib.sha256(seed.encode()).hexdigest()[:32]


def action_document(target: ReclaimTarget, *, key: str, now: Any) -> dict[str, Any]:
    """The action document: ``type`` action.reclaim, ``timestamp`` (RFC 3339, when it was
    sent) and ``data`` (the job, its owner, the policy and the numbers behind the step)."""
    return {
        "type": ACTION_TYPE,
        "timestamp": rfc3339(now),
        "data": {
            "idempotency_key": key,
            "job_id": target.job_id,
            "user": target.user,
            "team": target.team,
            "nodes": list(target.nodes),
            "labels": dict(target.labels),
            "mode": target.mode,
            "policy": target.policy,
            "dry_run": False,
            "reason": target.reason,
            "figures": dict(target.figures) | target.verdict.amounts(),
        },
    }


class WebhookDriver:
    """Reclaims by POSTing to a webhook (a ``type: webhook`` channel, with a secret); never
    raises."""

    name = "webhook"
    modes = MODES

    def __init__(
        self, channel: ChannelSpec, client: httpx.Client, *, clock: Clock = utc_now
    ) -> None:
        self.channel = channel
        self.client = client
        self.clock = clock

    def close(self) -> None:
        """Close the HTTP client it posts with."""
        self.client.close()

    def reclaim(self, target: ReclaimTarget, *, dry_run: bool) -> ReclaimResult:
        """POST the signed action document (dry run: say so, send nothing)."""
        key = idempotency_key(target)
        what = f"POST {ACTION_TYPE} for {target.job_id} to the {self.channel.name}"
        if target.mode not in MODES:
            return ReclaimResult("failed", f"unknown mode {target.mode!r}; a webhook does {MODES}")
        if not self.channel.secret:
            return ReclaimResult(
                "failed",
                f"the {self.channel.name} has no secret; an action webhook is always signed "
                "(set GPUWARDEN_ACTION_WEBHOOK_SECRET=whsec_...)",
            )
        if dry_run:
            return ReclaimResult("would", f"{what} (webhook-id {key})")
        now = self.clock()
        body = dumps(action_document(target, key=key, now=now))
        try:
            post_json(
                self.client,
                self.channel.url,
                content=body,
                headers=signature_headers(self.channel.secret, key, now, body),
                what=f"the {self.channel.name}",
            )
        except DeliveryError as exc:
            return _refused(exc, what)
        except ValidationFailed as exc:  # the URL's host resolved to a refused address
            return ReclaimResult("failed", f"{what}: not sent: {exc.message}")
        return ReclaimResult("reclaimed", f"{what} (webhook-id {key})")


def _refused(exc: DeliveryError, what: str) -> ReclaimResult:
    """gone for 404/410, else failed with the delivery table's reason and any Retry-After."""
    if exc.status in GONE_STATUSES:
        return ReclaimResult("gone", f"{what}: HTTP {exc.status}: the receiver has no such job")
    row = refusal(exc.status)
    why = _WHY[row] if row is not None else "refused"
    detail = f"{exc} ({why})"
    if exc.retry_after:
        detail += f"; Retry-After {exc.retry_after}"
    return ReclaimResult("failed", detail)
