"""`policies check` and `serve` refuse configs that would break or mislead, naming the field."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from service.cli.main import main
from service.errors import ConfigError
from service.usecases.config_check import check_config_file

POLICY = """
  - name: low
    metric: sm_active
    op: "<"
    threshold: {threshold}
    for: 15m
"""


def check(tmp_path: Path, text: str, capsys) -> tuple[int, str]:
    path = tmp_path / "gpuwarden.yaml"
    path.write_text(text)
    code = main(["policies", "check", str(path)])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_a_misspelt_top_level_key_is_refused(tmp_path: Path, capsys) -> None:
    code, out = check(tmp_path, "polices:" + POLICY.format(threshold=0.3), capsys)
    assert code == 1
    assert "polices: unknown key; did you mean policies?" in out
    assert "valid" not in out


def test_a_threshold_outside_the_metric_range_is_refused(tmp_path: Path, capsys) -> None:
    code, out = check(tmp_path, "policies:" + POLICY.format(threshold=30), capsys)
    assert code == 1
    assert "policies.0.threshold: 30 is outside sm_active's range 0..1" in out
    assert "write 0.3 for 30%" in out
    code, out = check(tmp_path, "policies:" + POLICY.format(threshold=0.3), capsys)
    assert code == 0 and "1 policies, 0 channels and 0 prices are valid" in out


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ("{model_pattern: '*H100*', usd_per_gpu_hour: 4}", "prices.0.effective_from: is required"),
        ("{model_pattern: '*H100*', effective_from: 2026-01-01}", "prices.0.usd_per_gpu_hour"),
        (
            "{model_pattern: '*H100*', usd_per_gpu_hour: 4, effective_from: '2026-01-01T00:00:00'}",
            "prices.0.effective_from: needs a timezone",
        ),
        (
            "{model_pattern: '*H100*', usd_per_gpu_hour: 4, effective_from: 2026-01-01, cost: 1}",
            "prices.0.cost: unknown key",
        ),
        (
            "{model_pattern: '*H100*', usd_per_gpu_hour: -4, effective_from: 2026-01-01}",
            "prices.0.usd_per_gpu_hour",
        ),
    ],
)
def test_an_incomplete_price_is_refused_naming_the_field(
    tmp_path: Path, capsys, entry: str, field: str
) -> None:
    code, out = check(tmp_path, f"prices:\n  - {entry}\n", capsys)
    assert code == 1 and field in out, out


def test_prices_take_a_date_as_its_midnight_utc(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "prices:\n  - {model_pattern: '*H100*', usd_per_gpu_hour: 4, effective_from: 2026-01-01}\n"
        "  - {model_pattern: '*L4', usd_per_gpu_hour: 0.8, effective_from: '2026-02-01T00:00:00Z'}\n"
    )
    rows = check_config_file(path).prices
    assert [r.effective_from for r in rows] == [
        datetime(2026, 1, 1, tzinfo=UTC),
        datetime(2026, 2, 1, tzinfo=UTC),
    ]
    path.write_text("prices:\n  - {model_pattern: '*H100*', usd_per_gpu_hour: 4}\n")
    with pytest.raises(ConfigError, match=r"c.yaml: prices.0.effective_from"):
        check_config_file(path)


def test_every_mistake_of_a_file_is_reported_in_one_run(tmp_path: Path, capsys) -> None:
    text = """
channels:
  - name: hook
    type: webhook
    url: https://hooks.example.com/x
policies:
  - name: low
    metric: sm_active
    op: "<"
    threshold: 7
    for: 15m
    channels: [hook]
  - name: quiet
    metric: sm_active
    op: "<"
    threshold: 0.1
    for: 15m
    channels: [nosuch]
  - name: low
    metric: sm_active
    op: "<"
    threshold: 0.2
prices:
  - model_pattern: "*H100*"
    usd_per_gpu_hour: cheap
    effective_from: 2026-01-01
"""
    code, out = check(tmp_path, text, capsys)
    assert code == 1
    assert "4 errors:" in out
    for field in ("policies.0.threshold", "policies.1.channels.0", "policies.2.name",
                  "prices.0.usd_per_gpu_hour"):  # fmt: skip
        assert f"\n  {field}: " in out, (field, out)
    assert "'low' is defined twice" in out and "no channel named 'nosuch'" in out


def test_the_owners_section_is_checked_with_the_rest() -> None:
    from service.usecases.config_check import config_errors

    checked, errors = config_errors(
        {
            "owners": {
                "admins": {"email": "gpu-admins@example.org"},
                "users": [{"name": "alice", "email": "alice@example.org", "team": "ml"}],
            }
        }
    )
    assert errors == [] and [o.key for o in checked.owners] == ["admins", "user:alice"]
    _, errors = config_errors({"owners": {"users": [{"name": "bob", "email": "bob"}]}})
    assert errors == [
        "owners.users.0.email: address must be one e-mail address like alice@example.org"
    ]
    _, errors = config_errors({"owners": {"user": []}})
    assert errors == ["owners.user: unknown key; use admins, teams, users"]


def test_the_shipped_file_checks_clean_without_its_secrets_in_the_shell(
    monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The example's header says `gpuwarden policies check deploy/examples/gpuwarden.yaml`;
    pasted in a shell without its two secrets, the file is still valid: they are noted."""
    monkeypatch.delenv("SLACK_WEBHOOK_URL", raising=False)
    monkeypatch.delenv("GPUWARDEN_WEBHOOK_SECRET", raising=False)
    shipped = Path(__file__).resolve().parents[2] / "deploy/examples/gpuwarden.yaml"
    assert main(["policies", "check", str(shipped)]) == 0
    out = capsys.readouterr()
    assert "8 policies, 3 channels and 0 prices are valid" in out.out
    assert "SLACK_WEBHOOK_URL (channels.0.url) is not set here" in out.err
    assert "GPUWARDEN_WEBHOOK_SECRET (channels.1.secret) is not set here" in out.err
    # serve (and up, demo) still refuse to start with a secret missing.
    with pytest.raises(ConfigError, match="SLACK_WEBHOOK_URL is referenced but not set"):
        check_config_file(shipped)


def test_a_mistake_beside_an_unset_variable_is_still_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.delenv("NO_SUCH_SECRET", raising=False)
    text = (
        "channels:\n  - {name: hook, type: webhook, url: '${NO_SUCH_URL}', "
        "secret: '${NO_SUCH_SECRET}', rate_limit_per_second: -1}\n"
    )
    code, out = check(tmp_path, text, capsys)
    assert code == 1 and "channels.0.rate_limit_per_second" in out
