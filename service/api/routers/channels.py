"""``/api/v1/channels``: notification channels (secrets never shown) and test sends."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Body, status
from fastapi.responses import JSONResponse

from service.api.deps import Admin, Ctx, ReadConn, Reader, WriteConn
from service.api.schemas.alerting import ChannelPublic, ChannelTestResult
from service.db import changes_repo, policies_repo
from service.errors import DeliveryError
from service.notify import Notification
from service.notify.urlsafety import parse_allow_nets, resolve_checked
from service.thresholds.policy import parse_channel
from service.usecases.outbox import Dispatcher

router = APIRouter(prefix="/channels", tags=["alerting"])

_BODY = Body(
    description="a channel: name, type (slack|webhook|alertmanager|email|slack_dm), url,"
    " secret (whsec_...), to (email and slack_dm: fixed recipients)",
    examples=[{"name": "ops-webhook", "type": "webhook", "url": "https://hooks.example.com/gpu"}],
)


@router.get("", response_model=list[ChannelPublic])
def list_channels(conn: ReadConn, _: Reader) -> list[ChannelPublic]:
    """Every channel, without secrets."""
    return [ChannelPublic.of(c) for c in policies_repo.list_channels(conn)]


@router.post("", response_model=ChannelPublic, status_code=status.HTTP_201_CREATED)
def create_channel(
    ctx: Ctx, conn: WriteConn, token: Admin, doc: dict[str, Any] = _BODY
) -> ChannelPublic:
    """Create a channel; its URL must not resolve to a private address (see the allow-list)."""
    channel = parse_channel(doc)
    if channel.is_http:
        resolve_checked(
            channel.url,
            parse_allow_nets(ctx.settings.webhook_allow_nets),
            admit_url=ctx.settings.local_sink_url,
        )
    policies_repo.create_channel(conn, channel=channel, source="api", now=ctx.clock())
    changes_repo.record(conn, actor=token.actor, kind="channel", name=channel.name,
                        action="create", now=ctx.clock())  # fmt: skip
    return ChannelPublic.of(channel)


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT)
def delete_channel(name: str, ctx: Ctx, conn: WriteConn, token: Admin) -> None:
    """Delete a channel."""
    policies_repo.delete_channel(conn, name=name)
    changes_repo.record(conn, actor=token.actor, kind="channel", name=name, action="delete",
                        now=ctx.clock())  # fmt: skip


@router.post("/{name}/test", response_model=ChannelTestResult)
def test_channel(name: str, ctx: Ctx, conn: ReadConn, _: Admin) -> Any:
    """Send a test notification now; 502 with the reason if the channel does not take it."""
    channel = policies_repo.get_channel(conn, name=name)
    now = ctx.clock()
    note = Notification(
        delivery_id=f"msg_{uuid.uuid4().hex}",
        kind="test",
        status="firing",
        policy="gpuwarden-test",
        severity="info",
        description="A test notification from GPU Warden; no GPU is affected.",
        metric="sm_active",
        aggregate="avg",
        window="10m",
        op="<",
        threshold=0.3,
        value=0.05,
        scope="gpu",
        scope_key="gpu:GPU-test",
        labels={
            "node": "test-node",
            "gpu_uuid": "GPU-test",
            "gpu_index": "0",
            "policy": "gpuwarden-test",
            "severity": "info",
        },
        active_since=now,
        fired_at=now,
        alert_url=ctx.settings.public_url.rstrip("/") + "/api/v1/alerts",
    )
    dispatcher = Dispatcher(ctx)
    try:
        dispatcher.send_now(channel, note)
    except DeliveryError as exc:
        ctx.telemetry.notifications.labels(channel.name, "failed").inc()
        body = ChannelTestResult(delivered=False, delivery_id=note.delivery_id, error=str(exc))
        return JSONResponse(body.model_dump(), status_code=status.HTTP_502_BAD_GATEWAY)
    finally:
        dispatcher.client.close()
    ctx.telemetry.notifications.labels(channel.name, "sent").inc()
    return ChannelTestResult(delivered=True, delivery_id=note.delivery_id)
