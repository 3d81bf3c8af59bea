"""Policy and channel validation: the YAML file and the API share one schema and its messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.cli.main import main
from service.errors import ValidationFailed
from service.thresholds.policy import parse_config, parse_policy

GOOD = {"name": "p", "metric": "sm_active", "op": "<", "threshold": 0.3, "for": "15m"}


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"metric": "sm_util"}, "metric", "unknown metric 'sm_util'"),
        ({"op": "=="}, "op", "Input should be '<', '<=', '>' or '>='"),
        ({"for": "15 minutes"}, "for", "is not a duration like 30s"),
        ({"window": "0s"}, "window", "window must be greater than 0s"),
        ({"threshold": "low"}, "threshold", "valid number"),
        ({"scope": "rack"}, "scope", "'gpu', 'node' or 'job'"),
        ({"match": {"colour": "red"}}, "match", "cannot match on label 'colour'"),
        ({"severity": "page"}, "severity", "'info', 'warning' or 'critical'"),
        ({"name": "has space"}, "name", "should match pattern"),
        ({"bogus": 1}, "bogus", "Extra inputs are not permitted"),
    ],
)
def test_bad_policy_names_the_field(change: dict[str, object], field: str, message: str) -> None:
    with pytest.raises(ValidationFailed) as err:
        parse_policy(GOOD | change)
    assert err.value.field == field
    assert message in err.value.message


def test_missing_field_is_named() -> None:
    doc = dict(GOOD)
    del doc["threshold"]
    with pytest.raises(ValidationFailed) as err:
        parse_policy(doc)
    assert (err.value.field, err.value.message) == ("threshold", "Field required")


def test_durations_and_defaults() -> None:
    p = parse_policy(GOOD)
    assert (p.for_seconds, p.window_seconds, p.repeat_seconds) == (900, 300, 4 * 3600)
    assert p.document()["for"] == "15m"
    assert parse_policy(GOOD | {"for": 0}).for_seconds == 0


def test_config_errors_carry_the_list_position() -> None:
    cfg = {
        "channels": [{"name": "c", "type": "webhook", "url": "https://x.example"}],
        "policies": [GOOD | {"channels": ["c"]}, GOOD | {"name": "q", "channels": ["nope"]}],
    }
    with pytest.raises(ValidationFailed) as err:
        parse_config(cfg)
    assert err.value.field == "policies.1.channels.0"
    assert "no channel named 'nope'" in err.value.message
    cfg["policies"] = [GOOD, GOOD]
    with pytest.raises(ValidationFailed) as err:
        parse_config(cfg)
    assert err.value.field == "policies.1.name"
    cfg["channels"] = [{"name": "c", "type": "webhook", "url": "ftp://x", "secret": None}]
    with pytest.raises(ValidationFailed) as err:
        parse_config(cfg)
    assert (err.value.field, err.value.message) == (
        "channels.0.url",
        "must be an http:// or https:// URL",
    )


def test_channel_secret_must_be_standard_webhooks_key() -> None:
    cfg = {"channels": [{"name": "c", "type": "webhook", "url": "https://x", "secret": "hunter2"}]}
    with pytest.raises(ValidationFailed) as err:
        parse_config(cfg)
    assert err.value.field == "channels.0.secret"
    assert "hunter2" not in str(err.value)


def test_example_config_is_valid_and_has_the_default_policies(monkeypatch, capsys) -> None:
    monkeypatch.setenv("SLACK_WEBHOOK_URL", "https://hooks.slack.com/services/T/B/x")
    monkeypatch.setenv("GPUWARDEN_WEBHOOK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    path = Path(__file__).parents[2] / "deploy" / "examples" / "gpuwarden.yaml"
    assert main(["policies", "check", str(path)]) == 0
    assert "8 policies, 3 channels and 0 prices are valid" in capsys.readouterr().out
    import yaml

    from service.settings import expand_env

    policies, _ = parse_config(expand_env(yaml.safe_load(path.read_text())))
    by_name = {p.name: p for p in policies}
    low = by_name["low-sm-activity"]
    # The activity ladder, so the default works on GPUs without SM activity too.
    assert (low.metric, low.aggregate, low.window, low.op, low.threshold) == (
        "activity",
        "avg",
        "10m",
        "<",
        0.3,
    )
    assert (low.for_seconds, low.scope) == (900, "job")
    assert by_name["idle-held-gpu"].for_seconds == 1800
    silent = by_name["node-silent"]
    assert (silent.metric, silent.scope, silent.op, silent.threshold) == (
        "silent_seconds", "node", ">", 60
    )  # fmt: skip
    empty = by_name["allocated-idle-gpu"]  # a job's GPU with no process and nothing running
    assert (empty.metric, empty.scope, empty.op, empty.threshold) == (
        "cause:idle_empty",
        "job",
        ">=",
        0.9,
    )
    assert by_name["gpu-hardware-fault"].severity == "critical"
    assert by_name["gpu-hardware-fault"].for_seconds == 0
    hot = by_name["hot-gpu"]
    assert (hot.metric, hot.op, hot.threshold, hot.for_seconds) == (
        "temperature_celsius",
        ">",
        85,
        300,
    )


def test_policies_check_reports_bad_field(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("policies:\n  - name: p\n    metric: sm_active\n    op: '<'\n    threshold: x\n")
    assert main(["policies", "check", str(bad)]) == 1
    assert "policies.0.threshold" in capsys.readouterr().err


def test_activity_and_cause_metrics() -> None:
    base = {"name": "p", "aggregate": "avg", "window": "30m", "threshold": 0.5}
    launch = parse_policy(base | {"metric": "cause:launch_bound", "op": ">"})
    assert launch.low_utilization  # much waste of a cause: inhibited by a hardware fault
    healthy = parse_policy(base | {"metric": "cause:compute_tensor", "op": ">"})
    assert not healthy.low_utilization
    assert parse_policy(base | {"metric": "activity", "op": "<"}).low_utilization
    with pytest.raises(ValidationFailed) as err:
        parse_policy(base | {"metric": "cause:sleeping", "op": ">"})
    assert err.value.field == "metric" and "cause:launch_bound" in err.value.message
