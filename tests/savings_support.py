"""A labelled set of synthetic job histories for proven savings (issue 46): Slurm and Kubernetes,
recurring and one-off, with changed work mixed in; generated deterministically from a seed.

Each run carries its true work and version: two runs are the same work where both agree (a
change of script, GPUs, image, model size or input size starts a new version). The matcher sees
only what the schedulers say (its work key and shape, lengths and progress).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from service.core.matching import Run
from service.core.work_key import JobFacts, work_key_of
from tests.alerting_support import ingest
from tests.support import auth, iso

T0 = datetime(2026, 9, 1, tzinfo=UTC)
_SAFE = "bcdfghjklmnpqrstvwxz2456789"


@dataclass(frozen=True, slots=True)
class LabelledRun:
    """A run, its true work and version, and its earlier run's waste share (what fixes save)."""

    run: Run
    work: str
    version: int
    waste_fraction: float


@dataclass(slots=True)
class LabelledSet:
    """The runs of every history and how many histories made them."""

    runs: list[LabelledRun] = field(default_factory=list)
    histories: int = 0
    kinds: dict[str, int] = field(default_factory=dict)


def _suffix(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(_SAFE) for _ in range(n))


def _facts(rng: random.Random, kind: str, name: str, n: int, shape: dict[str, object]) -> JobFacts:
    """The job's facts as its scheduler would register run ``n`` of work ``name``."""
    models = (str(shape["model"]),) * int(str(shape["gpus"]))
    labels: dict[str, str] = {}
    if kind == "slurm":
        labels = {"name": name, "account": "proj1", "partition": "gpu"}
        if shape["script"] is not None:
            labels["script_sha256"] = str(shape["script"])
        return JobFacts(f"slurm:{rng.randrange(10**7)}", "u" + name[-2:], "ml", labels, models)
    if kind == "manual":
        return JobFacts(f"manual:{name}-{n}", "alice", "ml", {"work": name}, models)
    labels = {"image": str(shape["image"])}
    pod = {
        "k8s_job": f"{name}-{_suffix(rng, 5)}",
        "k8s_cron": f"{name}-{29000000 + n * 1440}-{_suffix(rng, 5)}",
        "k8s_deploy": f"{name}-{_suffix(rng, 9)}-{_suffix(rng, 5)}",
    }[kind]
    return JobFacts(f"k8s:team-a/{pod}", None, None, labels, models)


def _run(facts: JobFacts, start: datetime, gpu_seconds: float, units: float | None) -> Run:
    key = work_key_of(facts)
    wall = timedelta(seconds=gpu_seconds / max(key.gpu_count, 1))
    return Run(
        job_id=facts.job_id, key=key, started_at=start, ended_at=start + wall,
        gpu_seconds=gpu_seconds, units=units, unit="steps" if units is not None else None,
    )  # fmt: skip


def labelled_histories(seed: int = 46, count: int = 240) -> LabelledSet:
    """``count`` histories (about a quarter one-off) of Slurm, Kubernetes and manual jobs."""
    rng = random.Random(seed)
    out = LabelledSet()
    kinds = ("slurm", "slurm", "k8s_job", "k8s_cron", "k8s_deploy", "manual")
    for h in range(count):
        kind = rng.choice(kinds)
        out.kinds[kind] = out.kinds.get(kind, 0) + 1
        out.histories += 1
        name = f"work{h:03d}"
        one_off = rng.random() < 0.25
        # A one-off shares nothing: a unique name; some recur under a common name by other work.
        if one_off and kind == "slurm" and rng.random() < 0.4:
            name = "interactive"
        _history(rng, out, kind, name, 1 if one_off else rng.randint(3, 6), h)
    return out


def _history(rng: random.Random, out: LabelledSet, kind: str, name: str, runs: int, h: int) -> None:
    """The runs of one work, fixes and changes mixed in."""
    shape: dict[str, object] = {
        "gpus": rng.choice((1, 2, 4, 8)),
        "model": rng.choice(("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB")),
        "script": f"s{h}-0" if kind == "slurm" and rng.random() < 0.7 else None,
        "image": f"reg/{name}:v1",
    }
    progress = rng.random() < 0.5
    per_unit = rng.uniform(0.5, 5.0)
    units = rng.uniform(2_000, 20_000)
    waste = rng.uniform(0.1, 0.8)
    fixed = 1.0  # the share of per-unit time a fix left
    version = 0
    start = T0 + timedelta(days=rng.uniform(0, 20), hours=h % 24)
    if name == "interactive":  # a shared name used for unrelated one-off work
        start = T0 + timedelta(days=h % 40)
        units = rng.uniform(500, 50_000)
    for n in range(runs):
        event = rng.random() if n else 1.0
        if event < 0.06:  # other GPUs or model
            version += 1
            shape["gpus"] = int(str(shape["gpus"])) * 2 if event < 0.03 else shape["gpus"]
            if event >= 0.03:
                shape["model"] = "NVIDIA H200"
        elif event < 0.12 and (shape["script"] is not None or kind.startswith("k8s")):
            version += 1  # another script or image
            shape["script"] = f"s{h}-{version}" if shape["script"] is not None else None
            shape["image"] = f"reg/{name}:v{version + 1}"
        elif event < 0.2:  # more or less input, same code
            version += 1 if not progress else 0  # per unit, the work is the same
            units *= rng.choice((rng.uniform(1.8, 3.0), rng.uniform(0.25, 0.45)))
        elif event < 0.23:  # another model size passed as an argument: nothing says so
            version += 1
            per_unit *= rng.uniform(1.5, 2.5)
        elif event < 0.5 and fixed == 1.0:  # the fix GPU Warden named is applied
            fixed = 1 - rng.uniform(0.3, 1.0) * waste
        noise = rng.gauss(1.0, 0.04)
        if rng.random() < 0.05:  # a slow node or a busy file system: same work, longer
            noise *= rng.uniform(1.3, 1.6)
        gpu_seconds = per_unit * units * fixed * noise
        facts = _facts(rng, kind, name, n, shape)
        run = _run(facts, start, gpu_seconds, units if progress else None)
        out.runs.append(LabelledRun(run, f"{kind}:{name}:{h}", version, waste))
        start = (run.ended_at or start) + timedelta(days=rng.uniform(0.5, 6))


# Samples of an input-starved run and of the same work with the fix applied (H100, GPM).
STARVED = {"sm_active": 0.15, "gr_engine_active": 0.2, "tensor_active": 0.12,
           "fb_used_bytes": 20 * 2**30}  # fmt: skip
FIXED = {"sm_active": 0.95, "gr_engine_active": 0.97, "tensor_active": 0.9,
         "fb_used_bytes": 20 * 2**30}  # fmt: skip


def add_run(http: httpx.Client, tokens: dict[str, str], job_id: str, start: datetime,
            minutes: int, metrics: dict[str, Any], steps: float | None,
            labels: dict[str, str] | None = None) -> None:  # fmt: skip
    """One run of the work "bert" on GPU-a0 (alice, team nlp): samples, the job (registered
    and ended) and its progress where ``steps`` is given."""
    ingest(http, tokens["agent"], start=start, count=minutes * 6, metrics=metrics)
    end = start + timedelta(minutes=minutes)
    body = {"id": job_id, "user": "alice", "team": "nlp", "project": "bert",
            "labels": labels or {"work": "bert"}, "gpus": ["GPU-a0"],
            "started_at": iso(start), "ended_at": iso(end)}  # fmt: skip
    r = http.post("/api/v1/jobs", json=body, headers=auth(tokens["admin"]))
    assert r.status_code == 201, r.text
    if steps is not None:
        for at, value in ((start, 0.0), (end, steps)):
            r = http.post(f"/api/v1/jobs/{job_id}/progress", json={"unit": "steps", "value": value,
                          "at": iso(at)}, headers=auth(tokens["admin"]))  # fmt: skip
            assert r.status_code == 201, r.text
