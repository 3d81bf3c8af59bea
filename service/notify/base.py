"""What every notifier shares: the notification document and the one way to POST it."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Protocol

import httpx
from pydantic import (
    BaseModel,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from service.core.verdict import NO_VERDICT, Verdict, split_flat
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
    # The job's verdict (job alerts), stored as flat keys beside the others (old rows too).
    verdict: Verdict = NO_VERDICT
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

    @model_validator(mode="before")
    @classmethod
    def _nest_verdict(cls, doc: Any) -> Any:
        return split_flat(doc) if isinstance(doc, dict) else doc

    @model_serializer(mode="wrap")
    def _flat_verdict(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # The figures stay flat keys in the stored JSON, where the verdict field stands.
        doc: dict[str, Any] = handler(self)
        out: dict[str, Any] = {}
        for key, value in doc.items():
            if key == "verdict":
                out.update(value)
            else:
                out[key] = value
        return out

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
