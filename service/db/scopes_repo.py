"""What the evaluator alerts on: every GPU, node and running job with its labels and GPUs."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select

from service.db import holders_repo
from service.db.schema import gpus, nodes
from service.thresholds.evaluator import ScopeMember


@dataclass(frozen=True, slots=True)
class Scopes:
    """Scope members per scope type, and the GPUs that are lost."""

    gpu: list[ScopeMember]
    node: list[ScopeMember]
    job: list[ScopeMember]
    lost_gpu_ids: frozenset[int]

    @property
    def gpu_ids(self) -> list[int]:
        """Every GPU's id."""
        return [m.gpu_ids[0] for m in self.gpu]

    def of(self, scope: str) -> list[ScopeMember]:
        """The members of scope ``scope`` (gpu, node or job)."""
        members: list[ScopeMember] = getattr(self, scope)
        return members


def _joined(values: Iterable[str | None]) -> str:
    return ",".join(sorted({v for v in values if v}))


def scope_members(conn: Connection, *, now: datetime, start_skew_seconds: float) -> Scopes:
    """Every GPU, node and running job with its labels and GPUs (jobs: those holding a GPU at
    ``now`` by holders_repo's rule, ``start_skew_seconds`` its allowance)."""
    gpu_rows = conn.execute(
        select(
            gpus.c.id,
            gpus.c.uuid,
            gpus.c.gpu_index,
            gpus.c.model,
            gpus.c.lost_at,
            nodes.c.hostname,
        )
        .join(nodes, nodes.c.id == gpus.c.node_id)
        # A retired MIG instance no longer exists: nothing to alert on, never a lost GPU.
        .where(gpus.c.retired_at.is_(None))
    ).all()
    by_gpu = holders_repo.holders_at(conn, now=now, start_skew_seconds=start_skew_seconds)
    gpu_members, node_gpus = _gpu_members(gpu_rows, by_gpu)
    node_members = [
        ScopeMember(
            f"node:{host}",
            {"node": host, "model": _joined(g.model for g in gs)},
            tuple(g.id for g in gs),
        )
        for host, gs in sorted(node_gpus.items())
    ]
    job_members = _job_members(gpu_rows, by_gpu)
    lost = frozenset(g.id for g in gpu_rows if g.lost_at is not None and g.lost_at <= now)
    return Scopes(gpu_members, node_members, job_members, lost)


def _gpu_members(
    gpu_rows: Iterable[Any], by_gpu: Mapping[int, Sequence[holders_repo.Holder]]
) -> tuple[list[ScopeMember], dict[str, list[Any]]]:
    """The GPU scope's members (labelled with their holders, ``by_gpu``), and the GPU rows of
    each node by hostname."""
    gpu_members, node_gpus = [], defaultdict(list)
    for g in gpu_rows:
        js = by_gpu.get(g.id, [])
        labels = {
            "node": g.hostname,
            "gpu_uuid": g.uuid,
            "gpu_index": str(g.gpu_index),
            "model": g.model,
        }
        if js:
            labels |= {
                "job_id": _joined(j.job_id for j in js),
                "user": _joined(j.user for j in js),
                "team": _joined(j.team for j in js),
                "project": _joined(j.project for j in js),
            }
        gpu_members.append(ScopeMember(f"gpu:{g.uuid}", labels, (g.id,)))
        node_gpus[g.hostname].append(g)
    return gpu_members, node_gpus


def _job_members(
    gpu_rows: Iterable[Any], by_gpu: Mapping[int, Sequence[holders_repo.Holder]]
) -> list[ScopeMember]:
    """The job scope's members: each job holding a GPU (``by_gpu``), with the labels of the
    GPUs it holds among ``gpu_rows``."""
    by_job: dict[str, list[int]] = defaultdict(list)
    job_info: dict[str, holders_repo.Holder] = {}
    for gpu_id, holders in by_gpu.items():
        for h in holders:
            by_job[h.job_id].append(gpu_id)
            job_info[h.job_id] = h
    info = {g.id: g for g in gpu_rows}
    job_members = []
    for job_id, gpu_ids in sorted(by_job.items()):
        j = job_info[job_id]
        held_gpus = [info[i] for i in gpu_ids if i in info]
        labels = {
            "job_id": job_id,
            "user": j.user or "",
            "team": j.team or "",
            "project": j.project or "",
            "node": _joined(g.hostname for g in held_gpus),
            "gpu_uuid": _joined(g.uuid for g in held_gpus),
            # Indexes repeat across nodes, so a multi-node job's are node:index.
            "gpu_index": _joined(
                str(g.gpu_index)
                if len({h.hostname for h in held_gpus}) == 1
                else f"{g.hostname}:{g.gpu_index}"
                for g in held_gpus
            ),
            "model": _joined(g.model for g in held_gpus),
        }
        job_members.append(ScopeMember(f"job:{job_id}", labels, tuple(sorted(gpu_ids))))
    return job_members
