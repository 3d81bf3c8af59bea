"""The YAML config file checked whole before anything starts: keys, policies, channels, prices
and the owner directory.

Every item is checked even after one fails, so a file with three mistakes is reported with all
three in one run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from service.configfile import load_config_file
from service.costs.prices import PriceRow, parse_price_row
from service.errors import ConfigError, ValidationFailed
from service.thresholds.ladder import explain
from service.thresholds.owners import OwnerEntry, parse_owners_section
from service.thresholds.policy import (
    ChannelSpec,
    PolicySpec,
    check_policy_channels,
    condition_words,
    parse_channel,
    parse_policy,
)
from service.vocabulary import STEP_DONE_OUTCOMES

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class CheckedConfig:
    """What a valid config file holds."""

    policies: list[PolicySpec]
    channels: list[ChannelSpec]
    prices: list[PriceRow]
    owners: list[OwnerEntry]


def _each(
    config: dict[str, Any], key: str, parse: Callable[[Any, str], T], errors: list[str]
) -> list[tuple[int, T]]:
    """Parse every item of the list ``config[key]``; each failure's message goes to ``errors``."""
    raw = config.get(key) or []
    if not isinstance(raw, list):
        errors.append(f"{key}: must be a list")
        return []
    out = []
    for i, item in enumerate(raw):
        try:
            out.append((i, parse(item, f"{key}.{i}")))
        except ValidationFailed as exc:
            errors.append(str(exc))
    return out


def _names(raw: Any) -> list[tuple[int, str]]:
    items = raw if isinstance(raw, list) else []
    return [(i, str(d["name"])) for i, d in enumerate(items) if isinstance(d, dict) and "name" in d]


SECTIONS = ("channels", "policies", "prices", "owners")


def _position(error: str) -> tuple[int, int, str]:
    """Where an error's field lies in the file: its section, then its item."""
    parts = error.split(":", 1)[0].split(".")
    section = SECTIONS.index(parts[0]) if parts[0] in SECTIONS else len(SECTIONS)
    index = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else -1
    return section, index, error


def config_errors(config: dict[str, Any]) -> tuple[CheckedConfig, list[str]]:
    """What of ``config`` is valid, and every error found (``policies.2.window: ...``)."""
    errors: list[str] = []
    channels = _each(config, "channels", lambda c, at: parse_channel(c, prefix=at), errors)
    policies = _each(config, "policies", lambda p, at: parse_policy(p, prefix=at), errors)
    prices = _each(config, "prices", lambda r, at: parse_price_row(r, at=at), errors)
    # Names as written, so that an item which failed its own check still counts as defined.
    raw_names = {key: _names(config.get(key)) for key in ("channels", "policies")}
    for kind, names_in_order in raw_names.items():
        seen: set[str] = set()
        for i, name in names_in_order:
            if name in seen:
                errors.append(f"{kind}.{i}.name: {name!r} is defined twice")
            seen.add(name)
    names = {name for _, name in raw_names["channels"]}
    for i, p in policies:
        try:
            check_policy_channels(p, names, prefix=f"policies.{i}")
        except ValidationFailed as exc:
            errors.append(str(exc))
    owners: list[OwnerEntry] = []
    try:
        owners = parse_owners_section(config.get("owners"))
    except ValidationFailed as exc:
        errors.append(str(exc))
    errors.sort(key=_position)
    checked = CheckedConfig(
        [p for _, p in policies], [c for _, c in channels], [r for _, r in prices], owners
    )
    return checked, errors


def check_config_file(path: Path, *, unset: list[str] | None = None) -> CheckedConfig:
    """Every part of config file ``path`` validated; ConfigError names the file and every bad
    field (one line for one error, a line each under a count for more). With ``unset``, a
    ``${VAR}`` not set here is noted there (``channels.0.url (SLACK_WEBHOOK_URL)``) instead."""
    config = load_config_file(path, unset=unset)  # its ConfigError names unknown top-level keys
    checked, errors = config_errors(config)
    if len(errors) == 1:
        raise ConfigError(f"config file {path}: {errors[0]}")
    if errors:
        listed = "\n".join(f"  {e}" for e in errors)
        raise ConfigError(f"config file {path}: {len(errors)} errors:\n{listed}")
    return checked


def steps_done(actions: Iterable[Mapping[str, Any]], *, alert_id: object) -> int:
    """How many of a ladder's steps the audit log (GET /actions rows) records done in the alert
    episode ``alert_id``: one past the highest completed step."""
    done = [
        int(a["step"])
        for a in actions
        if a.get("alert_id") == alert_id and a.get("step") is not None
        and a.get("outcome") in STEP_DONE_OUTCOMES
    ]  # fmt: skip
    return max(done) + 1 if done else 0


def ladder_timelines(
    policies: Iterable[PolicySpec],
    firing: Iterable[Mapping[str, Any]] = (),
    actions: Iterable[Mapping[str, Any]] = (),
) -> list[str]:
    """Each ladder in words: relative to its condition's start (``when idle-held begins (T):
    warn at T+1h, ...``), then, from live data (firing alerts as GET /alerts lists them, and
    the steps GET /actions records), one line per job it runs on (``slurm:123 idle-held since
    10:02: warned 11:02, warn 11:47, cancel 12:02``, UTC)."""
    alerts = list(firing)
    steps = list(actions)
    lines = []
    for p in policies:
        if p.ladder is None:
            continue
        words = condition_words(p)
        lines.append(f"{p.name}: {explain(p.ladder, condition=words)}")
        for a in alerts:
            job = (a.get("labels") or {}).get("job_id")
            if a.get("policy") != p.name or not job:
                continue
            since = datetime.fromisoformat(str(a["active_since"]).replace("Z", "+00:00"))
            done = steps_done(steps, alert_id=a.get("id"))
            line = explain(p.ladder, condition=words, job_id=job, since=since, steps_done=done)
            lines.append(f"  {line}")
    return lines
