"""What a token may do to a job beyond its role: the one place the agent-token job rule lives.

An agent token writes for one node. On jobs it may only:

- create a job with at least one GPU of its own node, ``started_at`` within the last
  ``job_agent_max_start_age_seconds`` (not in the future past the ingest skew) and not before any
  of those GPUs was first seen;
- on an existing job, add intervals of its own node's GPUs (same start rule) or close them;
- end or change only a job its node registered (or observed) a part of, by the node recorded on
  each interval when it was registered: a GPU that moved to its node brings no right to the jobs
  its old node registered, nor may it register that GPU into them again (403);
- never change ``user``, ``team``, ``project`` or ``labels`` once the job exists (409), except
  filling a value still empty on a job that was only observed from process hints.

Admin tokens may do anything; reader tokens never write (the role check answers 403 first).
The functions are pure: the router reads the facts from the database and passes them in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from service.db.tokens_repo import Role, TokenInfo
from service.errors import Conflict, Forbidden

# The metadata an agent sets once, when the job is created.
CREATION_FIELDS = ("user", "team", "project", "labels")


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """What the rule needs to know of one GPU named in a request."""

    uuid: str
    node: str
    first_seen_at: datetime


@dataclass(frozen=True, slots=True)
class StartWindow:
    """How far back (seconds) and forward (seconds) an agent's ``started_at`` may lie."""

    max_age_seconds: float
    max_future_seconds: float


def agent_node(token: TokenInfo) -> str | None:
    """The node an agent token is limited to; None for admin (no limit)."""
    return token.node if token.role == Role.AGENT else None


def check_job_post(
    token: TokenInfo,
    *,
    existing: Mapping[str, Any] | None,
    fields: Mapping[str, Any],
    gpus: Sequence[GpuFacts],
    started_at: datetime,
    now: datetime,
    window: StartWindow,
) -> None:
    """Raise Forbidden or Conflict unless ``token`` may create or merge this job.

    ``existing`` is the stored job (None when new), ``fields`` the metadata the request sets and
    ``gpus`` the GPUs it names, each with its node and first sighting.
    """
    node = agent_node(token)
    if node is None:
        return
    if not gpus:
        raise Forbidden(
            f"gpus: an agent token registers jobs only with at least one GPU of its node {node!r}"
        )
    for i, gpu in enumerate(gpus):
        if gpu.node != node:
            raise Forbidden(f"gpus.{i}: GPU {gpu.uuid} is not on this agent's node {node!r}")
    _check_start(started_at, gpus=gpus, now=now, window=window)
    if existing is not None:
        _check_not_moved_in(node, gpus=gpus, intervals=existing.get("intervals", []))
        check_metadata_unchanged(token, existing=existing, fields=fields)


def _check_not_moved_in(
    node: str, *, gpus: Sequence[GpuFacts], intervals: Sequence[Mapping[str, Any]]
) -> None:
    """Raise Forbidden if a GPU of ``gpus`` already holds an interval of the job that another
    node registered: the GPU moved here since, and the job stays that node's."""
    for i, gpu in enumerate(gpus):
        for iv in intervals:
            if iv.get("gpu_uuid") == gpu.uuid and iv.get("registered_node") != node:
                raise Forbidden(
                    f"gpus.{i}: GPU {gpu.uuid} holds this job for node "
                    f"{iv.get('registered_node')!r}, which registered it; a GPU that moved to "
                    f"node {node!r} does not bring that node's jobs with it"
                )


def _check_start(
    started_at: datetime, *, gpus: Sequence[GpuFacts], now: datetime, window: StartWindow
) -> None:
    oldest = now - timedelta(seconds=window.max_age_seconds)
    if started_at < oldest:
        raise Forbidden(
            f"started_at: an agent token may register a start at most "
            f"{window.max_age_seconds:g} s back ({oldest.isoformat()})"
        )
    if started_at > now + timedelta(seconds=window.max_future_seconds):
        raise Forbidden("started_at: lies in the future")
    for i, gpu in enumerate(gpus):
        if started_at < gpu.first_seen_at:
            raise Forbidden(
                f"started_at: before GPU {gpu.uuid} (gpus.{i}) was first seen "
                f"({gpu.first_seen_at.isoformat()})"
            )


def check_metadata_unchanged(
    token: TokenInfo, *, existing: Mapping[str, Any], fields: Mapping[str, Any]
) -> None:
    """Raise Conflict if an agent token would change a job's user, team, project or labels.

    Repeating the stored value is no change (every node of a multi-node job sends the same).
    """
    if agent_node(token) is None:
        return
    fillable = existing.get("source") == "observed"
    for name in CREATION_FIELDS:
        if name not in fields:
            continue
        if name == "labels":
            stored_labels = existing.get("labels") or {}
            for key, value in (fields["labels"] or {}).items():
                if stored_labels.get(key, value if fillable else None) != value:
                    raise _changed(f"labels.{key}")
            continue
        stored = existing.get(name)
        if stored != fields[name] and not (fillable and stored is None):
            raise _changed(name)


def _changed(name: str) -> Conflict:
    return Conflict(
        f"{name}: is set when the job is created; an agent token may not change it "
        "(an admin token may)"
    )


def check_job_rights(
    token: TokenInfo, *, intervals: Sequence[Mapping[str, Any]], field: str = "job"
) -> None:
    """Raise Forbidden (naming ``field``) unless an agent token's node registered or observed
    an interval of the job: rights go by ``registered_node``, never by where a GPU is now."""
    node = agent_node(token)
    if node is None or any(iv.get("registered_node") == node for iv in intervals):
        return
    moved = sorted({iv["gpu_uuid"] for iv in intervals if iv.get("node") == node})
    if moved:
        owners = sorted({str(iv.get("registered_node")) for iv in intervals})
        raise Forbidden(
            f"{field}: GPU {', '.join(moved)} of this job moved to node {node!r} after node "
            f"{', '.join(owners)} registered the job there; the right to end or change a job "
            "stays with the node that registered it (an admin token may)"
        )
    raise Forbidden(
        f"{field}: node {node!r} registered no GPU of this job; it is not its to change"
    )


def check_job_end(token: TokenInfo, *, intervals: Sequence[Mapping[str, Any]]) -> None:
    """Raise Forbidden if an agent token ends a job of which its node registered no interval."""
    check_job_rights(token, intervals=intervals, field="ended_at")
