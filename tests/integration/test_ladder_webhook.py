"""The acting round with the real action webhook driver (both stores): the reclaim is POSTed to a
real receiver on loopback, signed (verified with ``standardwebhooks``), carrying the policy, the
reason and the figures; a refused attempt is retried later under the same idempotency key; the
service closes the driver's HTTP client when it stops."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import Engine
from standardwebhooks.webhooks import Webhook

from service.actions.registry import drivers_from
from service.actions.webhook import WebhookDriver
from service.usecases.ladder import Ladder
from tests.alerting_support import add_job, running_service
from tests.ladder_support import IDLE_HELD, STEPS, LadderWorld
from tests.receivers import Receiver
from tests.support import FakeClock

JOB = "slurm:4242"
SECRET = "whsec_" + base64.b64encode(b"ladder-action-webhook-key-32byte").decode()


@pytest.fixture
def receivers() -> Iterator[tuple[Receiver, Receiver]]:
    notices, actions = Receiver(), Receiver()
    yield notices, actions
    notices.close()
    actions.close()


def test_a_reclaim_through_the_action_webhook_is_signed_and_retried_under_one_key(
    app, engine: Engine, clock: FakeClock, receivers: tuple[Receiver, Receiver]
) -> None:
    notices, actions = receivers
    world = LadderWorld(app.state.ctx, engine, clock, notices, {})
    world.samples(1, IDLE_HELD)
    world.setup({"steps": STEPS, "dry_run": False, "reclaim": {"driver": "webhook"}})
    settings = world.ctx.settings
    settings.action_webhook_url = actions.url + "/reclaim"
    settings.action_webhook_secret = SECRET
    settings.action_retry_seconds = 120
    world.drivers = drivers_from(settings)
    add_job(world.engine, JOB, world.gpus, started_at=world.clock() - timedelta(minutes=1))
    actions.script = [(503, {})]  # the receiver is down at the first attempt
    world.idle_for(14)
    assert world.actions(JOB)[-1] == ("reclaim", "failed")
    world.idle_for(3)  # past the retry delay: tried again, taken
    assert world.actions(JOB)[-1] == ("reclaim", "reclaimed")
    first, second = actions.wait_for(2)
    assert first.headers["webhook-id"] == second.headers["webhook-id"]  # one step, one key
    doc = Webhook(SECRET).verify(second.body.decode(), second.headers)
    assert doc["type"] == "action.reclaim"
    data = doc["data"]
    assert data["idempotency_key"] == second.headers["webhook-id"]
    assert (data["job_id"], data["mode"], data["policy"]) == (JOB, "reclaim", "idle-held-job")
    assert data["dry_run"] is False and data["nodes"] == [world.hostname]
    assert data["reason"].startswith("idle-held since ")
    assert data["figures"]["condition_seconds"] >= 12 * 60
    world.idle_for(3)
    assert len(actions.received) == 2  # done: never sent again


def test_the_ladders_drivers_are_closed_when_the_service_stops(engine: Engine) -> None:
    with running_service(
        engine, action_webhook_url="http://127.0.0.1:9/reclaim", action_webhook_secret=SECRET
    ) as (_, ctx):
        ladder = next(
            h.__self__
            for h in ctx.shutdown_hooks
            if isinstance(getattr(h, "__self__", None), Ladder)
        )
        webhook = ladder.drivers["webhook"]
        assert isinstance(webhook, WebhookDriver) and not webhook.client.is_closed
    assert webhook.client.is_closed
