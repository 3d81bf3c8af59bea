"""The owner directory's schema and its pure rules: who a job's owner is and where to reach them.

A directory entry is a user, a team or the admins, each with an e-mail address and/or a Slack id
(a user id ``U...``/``W...`` for a direct message, a channel id ``C...``/``G...``) and a copy
(``cc_email``, ``cc_slack``: a manager or the team's channel). A user missing from the directory
(or without an address) falls back to their team, then to the admins; the fallback is said in
words so that it can be recorded with what was sent.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from service.errors import ValidationFailed
from service.thresholds.policy import first_error

OwnerKind = Literal["user", "team", "admins"]
OWNER_KINDS: tuple[OwnerKind, ...] = ("user", "team", "admins")
ADMINS = "admins"  # the one name of the admins' entry
# The address a policy's ``channels`` (or a ladder's notify_owner step) writes for "the job's
# owner": its notices go to the owner's directory addresses on the e-mail and Slack DM channels.
OWNER_ADDRESS = "owner"

# A user or team name as schedulers and Kubernetes write them (alice, j.doe, ml-vision, svc@x).
OWNER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,254}$"
# One mailbox, no display name, nothing a header could be split on.
EMAIL_PATTERN = r"^[^\s@<>,;:\"]+@[^\s@<>,;:\"]+\.[^\s@<>,;:\"]+$"
EMAIL_MAX = 254
SLACK_ID_PATTERN = r"^[UWCGD][A-Z0-9]{2,31}$"
_EMAIL = re.compile(EMAIL_PATTERN)
_SLACK_ID = re.compile(SLACK_ID_PATTERN)
LOOKUP_GROUPS = ("email", "slack", "team", "cc_email")


def _email(field: str, value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    if len(value) > EMAIL_MAX or not _EMAIL.match(value):
        raise ValueError(f"{field} must be one e-mail address like alice@example.org")
    return value


def _slack(field: str, value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    if not _SLACK_ID.match(value):
        raise ValueError(
            f"{field} must be a Slack user id (U0123ABCD) or channel id (C0123ABCD), not a name"
        )
    return value


class OwnerEntry(BaseModel):
    """A directory entry: a user, team or the admins, and how to reach them."""

    model_config = ConfigDict(extra="forbid")

    kind: OwnerKind
    name: str = Field(pattern=OWNER_NAME_PATTERN)
    email: str | None = None
    slack: str | None = None
    cc_email: str | None = None
    cc_slack: str | None = None
    team: str | None = Field(None, pattern=OWNER_NAME_PATTERN)  # a user's team, for fallback

    @field_validator("email", "cc_email")
    @classmethod
    def _emails(cls, value: str | None) -> str | None:
        return _email("address", value)

    @field_validator("slack", "cc_slack")
    @classmethod
    def _slacks(cls, value: str | None) -> str | None:
        return _slack("slack", value)

    @property
    def reachable(self) -> bool:
        """Whether the entry has an address a notice can go to."""
        return bool(self.email or self.slack)

    @property
    def key(self) -> str:
        """``user:alice``, ``team:vision`` or ``admins``."""
        return ADMINS if self.kind == "admins" else f"{self.kind}:{self.name}"


def parse_owner(doc: Any, *, kind: OwnerKind | None = None, prefix: str = "") -> OwnerEntry:
    """One directory entry (``kind`` given by its section); ValidationFailed names the field."""
    if kind is not None and isinstance(doc, dict):
        doc = {"kind": kind, **doc}
        if kind == "admins":
            doc.setdefault("name", ADMINS)
    try:
        entry = OwnerEntry.model_validate(doc)
    except ValidationError as exc:
        raise first_error(exc, prefix) from None
    if entry.kind == "admins" and entry.name != ADMINS:
        raise ValidationFailed(".".join(p for p in (prefix, "name") if p), "must be admins")
    return entry


def parse_owners_section(section: Any, *, prefix: str = "owners") -> list[OwnerEntry]:
    """The config file's ``owners:`` mapping (``admins``, ``teams``, ``users``) as entries."""
    if section is None:
        return []
    if not isinstance(section, dict):
        raise ValidationFailed(prefix, "must be a mapping with admins, teams and users")
    for key in section:
        if key not in ("admins", "teams", "users"):
            raise ValidationFailed(f"{prefix}.{key}", "unknown key; use admins, teams, users")
    out: list[OwnerEntry] = []
    if section.get("admins") is not None:
        out.append(parse_owner(section["admins"], kind="admins", prefix=f"{prefix}.admins"))
    for key, kind in (("teams", "team"), ("users", "user")):
        raw = section.get(key) or []
        if not isinstance(raw, list):
            raise ValidationFailed(f"{prefix}.{key}", "must be a list")
        seen: set[str] = set()
        for i, doc in enumerate(raw):
            entry = parse_owner(doc, kind=kind, prefix=f"{prefix}.{key}.{i}")  # type: ignore[arg-type]
            if entry.name in seen:
                raise ValidationFailed(f"{prefix}.{key}.{i}.name", f"{entry.name!r} twice")
            seen.add(entry.name)
            out.append(entry)
    return out


def parse_lookup_output(text: str, pattern: str, *, user: str) -> OwnerEntry | None:
    """The entry a lookup command's output gives for ``user`` by ``pattern`` (a regular
    expression with named groups email, slack, team, cc_email), or None when it gives none."""
    match = re.search(pattern, text, flags=re.MULTILINE)
    if match is None:
        return None
    found = {g: (match.groupdict().get(g) or None) for g in LOOKUP_GROUPS}
    try:
        return OwnerEntry(kind="user", name=user, **found)
    except ValidationError:
        return None  # the command's answer is no address we can send to


@dataclass(frozen=True, slots=True)
class Addressee:
    """Where a notice meant for ``asked`` goes: ``entry``'s addresses, or nowhere (None).

    ``fallback`` is None when the owner is reached directly, else ``team`` or ``admins``, with
    ``reason`` saying why in words.
    """

    asked: str
    entry: OwnerEntry | None
    fallback: Literal["team", "admins"] | None = None
    reason: str | None = None


Directory = Mapping[str, OwnerEntry]  # entries by key (user:alice, team:vision, admins)


def resolve_owner(directory: Directory, *, user: str | None, team: str | None) -> Addressee:
    """Where a notice to a job's owner (``user``, of ``team``) goes: the user, else the team
    (the job's, else the user entry's), else the admins."""
    asked = f"user:{user}" if user else (f"team:{team}" if team else ADMINS)
    entry = directory.get(f"user:{user}") if user else None
    if entry is not None and entry.reachable:
        return Addressee(asked, entry)
    why = (
        "the job names no user"
        if not user
        else f"user {user} has no address in the directory"
        if entry is None or not entry.reachable
        else ""
    )
    team = team or (entry.team if entry is not None else None)
    return _team_or_admins(directory, asked=asked, team=team, why=why)


def resolve_team(directory: Directory, *, team: str) -> Addressee:
    """Where a notice to ``team`` goes: the team, else the admins."""
    entry = directory.get(f"team:{team}")
    if entry is not None and entry.reachable:
        return Addressee(f"team:{team}", entry)
    return Addressee(
        f"team:{team}",
        _reachable(directory.get(ADMINS)),
        "admins",
        f"team {team} has no address in the directory",
    )


def _team_or_admins(directory: Directory, *, asked: str, team: str | None, why: str) -> Addressee:
    entry = directory.get(f"team:{team}") if team else None
    if entry is not None and entry.reachable:
        return Addressee(asked, entry, "team", f"{why}; sent to team {team}")
    team_why = f"team {team} has no address either" if team else "and no team is known"
    return Addressee(
        asked, _reachable(directory.get(ADMINS)), "admins", f"{why}; {team_why}; sent to admins"
    )


def _reachable(entry: OwnerEntry | None) -> OwnerEntry | None:
    return entry if entry is not None and entry.reachable else None
