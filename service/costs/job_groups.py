"""Groups of jobs by Kubernetes namespace or by any job label (``group_by=namespace``,
``group_by=label:<key>``), as OpenCost groups workloads.

Pure: takes a job's id and labels, returns its group's key.
"""

from __future__ import annotations

from collections.abc import Mapping

from service.vocabulary import MAX_LABEL_KEY_CHARS

LABEL_PREFIX = "label:"
NO_NAMESPACE = "__no_namespace__"  # a job neither k8s:<namespace>/<pod> nor labelled namespace
UNLABELLED = "__unlabelled__"  # a job without the label a report groups by
# Labels that name a job's namespace where its id does not (a job posted by a controller).
NAMESPACE_LABELS = ("namespace", "kubernetes.io/metadata.name")


def label_key(group_by: str) -> str | None:
    """The label key of a ``label:<key>`` grouping, None for any other grouping."""
    return group_by[len(LABEL_PREFIX) :] if group_by.startswith(LABEL_PREFIX) else None


def by_job_labels(group_by: str) -> bool:
    """Whether ``group_by`` groups jobs by their namespace or a label (read from the jobs)."""
    return group_by == "namespace" or label_key(group_by) is not None


def label_keys_of(group_by: str) -> tuple[str, ...]:
    """The job labels a ``namespace`` or ``label:<key>`` grouping reads."""
    key = label_key(group_by)
    return NAMESPACE_LABELS if key is None else (key,)


def label_key_problem(group_by: str) -> str | None:
    """Why ``label:<key>`` names no label key (empty, too long, a control character), or None."""
    key = label_key(group_by)
    if key is None:
        return None
    if not key.strip():
        return "label: needs a label key, e.g. label:app.kubernetes.io/name"
    if len(key) > MAX_LABEL_KEY_CHARS:
        return f"a label key has at most {MAX_LABEL_KEY_CHARS} characters"
    if any(ord(c) < 32 or ord(c) == 127 for c in key):
        return "a label key has no control characters"
    return None


def namespace_of(job_id: str, labels: Mapping[str, object]) -> str:
    """A job's namespace: the one its ``k8s:<namespace>/<pod>`` id names, else its
    ``namespace`` label, else ``__no_namespace__``."""
    if job_id.startswith("k8s:") and "/" in job_id:
        return job_id[len("k8s:") :].split("/", 1)[0] or NO_NAMESPACE
    for name in NAMESPACE_LABELS:
        value = labels.get(name)
        if isinstance(value, str) and value:
            return value
    return NO_NAMESPACE


def group_key(group_by: str, job_id: str, labels: Mapping[str, object]) -> str:
    """The key of a job's group under ``namespace`` or ``label:<key>`` (``__unlabelled__``
    for a job without that label, or with it empty)."""
    if group_by == "namespace":
        return namespace_of(job_id, labels)
    key = label_key(group_by)
    assert key is not None, group_by
    value = labels.get(key)
    return value if isinstance(value, str) and value else UNLABELLED
