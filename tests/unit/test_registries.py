"""Extension points that cannot fall through: every channel type, reclaim driver, waste cause
and outbox payload kind has its own branch, and an unknown one is an error, never a default."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast, get_args

import httpx
import pytest
from pydantic import ValidationError

from service.actions.registry import driver_of
from service.core.diagnosis import CAUSES, Cause
from service.costs.recommend import FixAssumptions, constant_fraction
from service.errors import ValidationFailed
from service.notify import notifier_for
from service.notify.envelope import Envelope
from service.notify.report import ReportMessage
from service.settings import Settings
from service.thresholds.ladder import (
    DRIVER_NAMES,
    DriverName,
    LadderSpec,
    reclaim_mode,
    step_word,
)
from service.thresholds.policy import ChannelSpec, ChannelType, parse_channel
from service.usecases.outbox import OUTBOX_PAYLOAD

LADDER = LadderSpec.model_validate(
    {"steps": [{"action": "notify_owner", "after": "1h"}, {"action": "reclaim", "after": "2h"}]}
)


def channel(kind: str) -> ChannelSpec:
    """A channel of ``kind`` built without validation, as a stored row of a newer version."""
    return ChannelSpec.model_construct(
        name="c", type=cast(ChannelType, kind), url="https://hooks.example/x", to=[]
    )


@pytest.mark.parametrize("kind", get_args(ChannelType))
def test_every_channel_type_has_a_notifier_of_its_own(kind: ChannelType) -> None:
    with httpx.Client() as client:
        notifier = notifier_for(channel(kind), client, Settings())
    assert type(notifier).__name__.lower().replace("notifier", "") == kind.replace("_", "")


def test_an_unknown_channel_type_is_an_error_not_an_alertmanager() -> None:
    with httpx.Client() as client, pytest.raises(AssertionError, match="pagerduty"):
        notifier_for(channel("pagerduty"), client, Settings())


def test_an_unknown_channel_type_is_refused_at_load_naming_the_field() -> None:
    with pytest.raises(ValidationFailed) as err:
        parse_channel({"name": "p", "type": "pagerduty", "url": "https://x.example"})
    assert err.value.field == "type" and "'slack'" in err.value.message


@pytest.mark.parametrize("driver", DRIVER_NAMES)
def test_every_driver_has_a_mode_and_every_mode_a_word(driver: DriverName) -> None:
    spec = LADDER.model_copy(
        update={"reclaim": LADDER.reclaim.model_copy(update={"driver": driver})}
    )
    assert reclaim_mode(spec, driver)
    assert step_word(spec, spec.steps[-1], "job-1") != "warn"


def test_an_unknown_driver_is_an_error_not_the_webhook() -> None:
    with pytest.raises(AssertionError, match="pbs"):
        reclaim_mode(LADDER, cast(DriverName, "pbs"))
    with pytest.raises(AssertionError, match="pbs"):
        driver_of(cast(DriverName, "pbs"), Settings(), None)


def test_the_registry_builds_each_configured_driver_by_its_name() -> None:
    built = {name: driver_of(name, Settings(), None) for name in DRIVER_NAMES}
    assert {n for n, d in built.items() if d is not None} == {"slurm", "kubernetes"}
    assert built["webhook"] is None  # no GPUWARDEN_ACTION_WEBHOOK_URL


@pytest.mark.parametrize("cause", CAUSES)
def test_every_cause_has_a_constant_share(cause: Cause) -> None:
    share, why = constant_fraction(cause, FixAssumptions())
    assert 0.0 <= share <= 1.0 and why


def test_an_unknown_cause_is_an_error_not_a_healthy_zero() -> None:
    with pytest.raises(AssertionError, match="99"):
        constant_fraction(cast(Cause, 99), FixAssumptions())


AT = datetime(2026, 12, 7, tzinfo=UTC)
REPORT: dict[str, Any] = {
    "delivery_id": "r", "kind": "report", "recipient": "admins", "period": "weekly",
    "period_start": AT, "period_end": AT, "subject": "s", "text": "t", "html": "h", "slack": {},
    "figures": {}, "page_url": "https://x.example/r",
}  # fmt: skip
MESSAGE: dict[str, Any] = {
    "delivery_id": "m", "kind": "message", "to": ["a@example.com"],
    "message": {"subject": "s", "text": "t", "html": "h", "slack_text": "t"},
}  # fmt: skip


def test_an_outbox_payload_is_read_as_the_type_its_kind_names() -> None:
    assert isinstance(OUTBOX_PAYLOAD.validate_python(REPORT), ReportMessage)
    assert isinstance(OUTBOX_PAYLOAD.validate_python(MESSAGE), Envelope)
    with pytest.raises(ValidationError, match="postcard"):
        OUTBOX_PAYLOAD.validate_python(REPORT | {"kind": "postcard"})
