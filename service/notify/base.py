"""What every notifier shares: the notification document and the one way to POST it."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Protocol

import httpx
from pydantic import BaseModel, field_validator

from service.delivery import rfc3339
from service.errors import DeliveryError
from service.thresholds.policy import SILENT_SECONDS
from service.vocabulary import HARDWARE_XID_MEANINGS, SCOPE_LABEL, canonical_labels


class Notification(BaseModel):
    """One message about one alert (or a channel test), as queued in the outbox."""

    delivery_id: str
    # notice: a ladder's step (a warning to the job's owner, a reclaim, or a dry run's "would").
    kind: Literal["firing", "repeat", "resolved", "resend", "test", "notice"]
    status: Literal["firing", "resolved"]
    policy: str
    severity: str
    description: str | None = None
    metric: str
    aggregate: str
    window: str
    op: str
    threshold: float
    value: float | None
    scope: str
    scope_key: str
    labels: dict[str, str]
    active_since: datetime
    fired_at: datetime | None = None
    resolved_at: datetime | None = None
    ends_at: datetime | None = None  # for Alertmanager: when to consider it gone unless re-sent
    stale: bool = False
    # Muted in GPU Warden while firing: only Alertmanager is still sent it, to keep it alive.
    silenced: bool = False
    suppressed: bool = False  # by a hardware fault on its GPU
    # The job's verdict (job alerts): its waste so far (USD) = idle (certain) + fixable
    # (estimated), its top cause (the one whose fix saves most), that fix and its saving (USD).
    waste_usd: float | None = None
    cost_usd: float | None = None  # the job's cost so far (USD), every held second priced
    idle_usd: float | None = None
    fixable_usd: float | None = None
    top_cause: str | None = None
    fix: str | None = None
    fix_saving_usd: float | None = None
    # A hardware fault's most recent hardware XID code in the window, when one caused it.
    xid_code: int | None = None
    # The GPU's exporter sends no memory use: "held" was told by a job or process holding it.
    memory_unknown: bool = False
    report_url: str | None = None
    alert_url: str | None = None
    alert_id: int | None = None
    # A notice's text: what was seen, its cause, the dollars so far, what happens next and when.
    notice: str | None = None
    next_step: str | None = None  # the ladder's next step in words ("cancel"), if any
    next_step_at: datetime | None = None

    @field_validator("labels", mode="after")
    @classmethod
    def _canonical(cls, labels: dict[str, str]) -> dict[str, str]:
        # Deliveries queued before the label vocabulary was unified still say job and gpu.
        return canonical_labels(labels)

    def headline(self) -> str:
        """One line saying what happened where, e.g. "[FIRING] low-sm-activity on job slurm:42"
        or "[FIRING] hot-gpu on node-a GPU 0 (GPU-a0)"."""
        where = self.labels.get(SCOPE_LABEL.get(self.scope, self.scope)) or self.scope_key
        prefix = {"test": "TEST", "notice": "NOTICE"}.get(self.kind, self.status.upper())
        node, index = self.labels.get("node"), self.labels.get("gpu_index")
        if self.scope == "gpu" and node and index:
            return f"[{prefix}] {self.policy} on {node} GPU {index} ({where})"
        return f"[{prefix}] {self.policy} on {self.scope} {where}"

    def alert_labels(self) -> dict[str, str]:
        """The alert's non-empty labels in the one vocabulary, with ``policy`` and ``severity``."""
        labels = self.labels | {"policy": self.policy, "severity": self.severity}
        return {k: v for k, v in labels.items() if v}

    def waste(self) -> str | None:
        """The job's waste so far in words, e.g. "waste so far $3.00 (idle $2.00 + fixable
        $1.00, estimated)", or None when unknown."""
        if self.waste_usd is None:
            return None
        text = f"waste so far ${self.waste_usd:,.2f}"
        if self.idle_usd is not None and self.fixable_usd is not None:
            text += f" (idle ${self.idle_usd:,.2f} + fixable ${self.fixable_usd:,.2f}, estimated)"
        return text

    def verdict(self) -> str | None:
        """The job's verdict in one line, e.g. "top cause: launch_bound; fix: CUDA graphs, ...
        (saves about $0.67)", or None without a top cause."""
        if not self.top_cause:
            return None
        text = f"top cause: {self.top_cause}"
        if self.fix:
            text += f"; fix: {self.fix}"
            if self.fix_saving_usd is not None:
                text += f" (saves about ${self.fix_saving_usd:,.2f})"
        return text

    def condition(self) -> str:
        """The value against the threshold, e.g. "avg sm_active over 10m = 0.12 (< 0.3)", with
        the XID of a hardware fault: "...; XID 79 (GPU has fallen off the bus)"."""
        value = "no data" if self.value is None else f"{self.value:.4g}"
        if self.metric == SILENT_SECONDS:  # a node's silence is no aggregate over a window
            return f"no report for {value} s ({self.op} {self.threshold:g})"
        text = (
            f"{self.aggregate} {self.metric} over {self.window} = {value} "
            f"({self.op} {self.threshold:g})"
        )
        if self.xid_code is not None:
            meaning = HARDWARE_XID_MEANINGS.get(self.xid_code)
            text += f"; XID {self.xid_code}" + (f" ({meaning})" if meaning else "")
        if self.memory_unknown:
            text += "; memory use not reported by this GPU's exporter: held by a job or process"
        return text


class Notifier(Protocol):
    """Sends one notification to one channel; raises DeliveryError saying whether to retry."""

    def send(self, note: Notification) -> None: ...


def post_json(
    client: httpx.Client,
    url: str,
    *,
    content: bytes,
    headers: dict[str, str] | None = None,
    what: str,
) -> httpx.Response:
    """POST ``content`` as JSON; a 2xx returns, anything else raises DeliveryError.

    The error carries the status (None when no answer came) and Retry-After; the outbox applies
    the delivery table to it. Redirects are never followed. ``what`` names the channel; the URL
    is never put in messages because a Slack webhook URL is itself a secret.
    """
    all_headers = {"content-type": "application/json", **(headers or {})}
    try:
        response = client.post(url, content=content, headers=all_headers)
    except httpx.TimeoutException as exc:
        raise DeliveryError(f"{what}: timed out ({type(exc).__name__})", status=None) from None
    except httpx.HTTPError as exc:
        raise DeliveryError(f"{what}: network error ({type(exc).__name__})", status=None) from None
    code = response.status_code
    if 200 <= code < 300:
        return response
    retry_after = response.headers.get("retry-after")
    if 300 <= code < 400:
        raise DeliveryError(f"{what}: HTTP {code} redirect (not followed)", status=code)
    if code >= 500 or code in (408, 429):
        raise DeliveryError(f"{what}: HTTP {code}", status=code, retry_after=retry_after)
    raise DeliveryError(
        f"{what}: HTTP {code} {response.text[:200]!r}", status=code, retry_after=retry_after
    )


def iso(ts: datetime | None) -> str | None:
    """RFC 3339 UTC text of ``ts`` (with Z), or None."""
    return None if ts is None else rfc3339(ts)


def dumps(doc: Any) -> bytes:
    """Compact JSON bytes, the exact bytes that are signed and sent."""
    import json

    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
