"""A job's work key (issue 46): which stored jobs are runs of the same work, read from what the
schedulers already say, and the shape of each run that decides whether two runs compare.

Runs of one key are grouped by ``key`` (a stable hash of the identity fields); the shape (GPU
count and model, script hash, container image) is kept beside it, so a later run whose shape
differs is shown as "not compared" with its reason rather than silently left out.

- Slurm (``slurm:<id>``): the job name, user, account and partition (the prolog's ``name``,
  ``account`` and ``partition`` labels); shape: GPUs, model and ``script_sha256`` where sent.
  Without a name, the script's hash takes its place.
- Kubernetes (``k8s:<namespace>/<pod>``): the owning workload (Job, CronJob, Deployment,
  StatefulSet or notebook) as the ``workload_kind``/``workload`` labels say, else as the pod's
  generated name says; shape: GPUs, model and the ``image`` label.
- Any job with a ``work`` label: that label and the user (the user's word that the runs are
  one work); shape: GPUs and model only.
- Anything else is a one-off: its key is its own id.

Pure: a job's fields in, a key out.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

WorkKind = Literal["work_label", "slurm", "kubernetes", "one_off"]

# Kubernetes' generated name suffixes use this alphabet (apimachinery rand.SafeEncodeString).
_SAFE = "[bcdfghjklmnpqrstvwxz2456789]"
# <deployment>-<pod-template-hash>-<5>, <cronjob>-<scheduled minute>-<5>, <job>-<5>,
# <statefulset>-<ordinal>: tried in this order (the longer suffixes first).
_POD_OWNERS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("CronJob", re.compile(rf"^(?P<name>.+)-\d{{8,}}-{_SAFE}{{5}}$")),
    ("Deployment", re.compile(rf"^(?P<name>.+)-{_SAFE}{{6,10}}-{_SAFE}{{5}}$")),
    ("Job", re.compile(rf"^(?P<name>.+)-{_SAFE}{{5}}$")),
    ("StatefulSet", re.compile(r"^(?P<name>.+)-\d+$")),
)
# JupyterHub's single-user pods (jupyter-<user>) are notebooks.
_NOTEBOOK = re.compile(r"^jupyter-(?P<name>.+)$")
WORKLOAD_KINDS = ("Job", "CronJob", "Deployment", "StatefulSet", "notebook")


@dataclass(frozen=True, slots=True)
class JobFacts:
    """What a work key is read from: the job's id, user, team, labels and its GPUs' models
    (one entry per GPU it held)."""

    job_id: str
    user: str | None
    team: str | None
    labels: Mapping[str, Any]
    gpu_models: Sequence[str] = ()

    @classmethod
    def of(cls, job: Mapping[str, Any], gpu_models: Sequence[str] = ()) -> JobFacts:
        """The facts of a stored job's row (``jobs_repo.get_job``'s form)."""
        return cls(
            job_id=str(job["id"]),
            user=job.get("user"),
            team=job.get("team"),
            labels=job.get("labels") or {},
            gpu_models=tuple(gpu_models),
        )


@dataclass(frozen=True, slots=True)
class WorkKey:
    """A job's work key: ``key`` groups its runs; ``identity`` the fields hashed into it; the
    shape fields decide whether two runs of the key compare."""

    key: str
    kind: WorkKind
    identity: tuple[tuple[str, str], ...]
    gpu_count: int
    gpu_model: str | None
    script_sha256: str | None
    image: str | None

    def as_dict(self) -> dict[str, Any]:
        """The key and its fields as the API shows them."""
        return {
            "key": self.key,
            "kind": self.kind,
            "identity": dict(self.identity),
            "gpu_count": self.gpu_count,
            "gpu_model": self.gpu_model,
            "script_sha256": self.script_sha256,
            "image": self.image,
        }


def _label(labels: Mapping[str, Any], name: str) -> str | None:
    value = labels.get(name)
    return str(value) if value not in (None, "") else None


def _hash(kind: WorkKind, identity: tuple[tuple[str, str], ...]) -> str:
    """The stable key of ``identity``: sha256 of its canonical JSON, 32 hex digits."""
    text = json.dumps([kind, [list(p) for p in identity]], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def pod_owner(pod: str) -> tuple[str, str] | None:
    """The (kind, name) of the workload that owns a pod, as its generated name says; None for a
    name that no controller generated (a bare pod)."""
    if m := _NOTEBOOK.match(pod):
        return "notebook", m.group("name")
    for kind, pattern in _POD_OWNERS:
        if m := pattern.match(pod):
            return kind, m.group("name")
    return None


def _pod_of(facts: JobFacts) -> tuple[str, str] | None:
    """The (namespace, pod) of a Kubernetes job: from ``k8s:<namespace>/<pod>`` or its labels."""
    if facts.job_id.startswith("k8s:") and "/" in facts.job_id:
        namespace, _, pod = facts.job_id[4:].partition("/")
        return namespace, pod
    ns, name = _label(facts.labels, "namespace"), _label(facts.labels, "pod")
    return (ns, name) if ns and name else None


def _identity(facts: JobFacts) -> tuple[WorkKind, tuple[tuple[str, str], ...]]:
    """The kind of key and the fields that name the work."""
    labels = facts.labels
    work = _label(labels, "work")
    if work is not None:
        return "work_label", (("work", work), ("user", facts.user or ""))
    name, script = _label(labels, "name"), _label(labels, "script_sha256")
    if facts.job_id.startswith("slurm:") and (name is not None or script is not None):
        account = _label(labels, "account") or facts.team or ""
        # Without its name (no scontrol asked), the script names the work.
        what = ("name", name) if name is not None else ("script_sha256", script or "")
        return "slurm", (
            what,
            ("user", facts.user or ""),
            ("account", account),
            ("partition", _label(labels, "partition") or ""),
        )
    pod = _pod_of(facts)
    if pod is not None:
        namespace, pod_name = pod
        kind, owner = _label(labels, "workload_kind"), _label(labels, "workload")
        found = (kind, owner) if kind is not None and owner is not None else pod_owner(pod_name)
        if found is not None:
            return "kubernetes", (("kind", found[0]), ("namespace", namespace), ("name", found[1]))
    return "one_off", (("job_id", facts.job_id),)


def work_key_of(job: JobFacts) -> WorkKey:
    """The work key of a job, with the shape of this run."""
    kind, identity = _identity(job)
    models = sorted(set(job.gpu_models))
    return WorkKey(
        key=_hash(kind, identity),
        kind=kind,
        identity=identity,
        gpu_count=len(job.gpu_models),
        gpu_model=None if not models else models[0] if len(models) == 1 else "+".join(models),
        script_sha256=_label(job.labels, "script_sha256") if kind != "work_label" else None,
        image=_label(job.labels, "image") if kind != "work_label" else None,
    )


def key_of_row(job_id: str, user: str | None, team: str | None, labels: Mapping[str, Any]) -> str:
    """The ``key`` alone of a job's stored fields (the GPUs shape a run, never its key)."""
    return work_key_of(JobFacts(job_id=job_id, user=user, team=team, labels=labels)).key
