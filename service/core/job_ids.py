"""The rules a job id (and any text that can reach a mail header or a command line) must meet:
no control characters anywhere, and the schedulers' canonical spellings, so that one job has
exactly one id and an id names the job a scheduler would act on.

Pure: strings in, a sentence naming what is wrong (or None) out.
"""

from __future__ import annotations

import re

# The control-character rule lives with the wire, which the agent may import (core it may not).
from service.wire import control_problem as control_problem
from service.wire import no_control as no_control

# A Slurm job id as squeue prints it: a job, an array task (``<job>_<task>``) or a
# heterogeneous job's component (``<job>+<offset>``); no leading zeros, so ``0101`` (which Slurm
# reads as 101) is not another spelling of job 101.
_NUMBER = r"(?:0|[1-9][0-9]*)"
SLURM_ID = re.compile(rf"^[1-9][0-9]*(?:_{_NUMBER}|\+{_NUMBER})?\Z")
# Kubernetes names: a namespace is a DNS-1123 label; a pod's name a DNS-1123 subdomain. Each
# pattern ends in \Z, not $, which also matches before a final newline ("101\n").
_DNS1123_LABEL = re.compile(r"^[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?\Z")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?\Z")
# A subdomain's parts have no length of their own (Kubernetes' IsDNS1123Subdomain): a pod's name
# may be one part of 100 characters.
_SUBDOMAIN_PART = re.compile(r"^[a-z0-9](?:[-a-z0-9]*[a-z0-9])?\Z")
KUBERNETES_PREFIXES = ("k8s", "kubernetes")
# What each pattern asks for, as a refusal names it.
_LABEL_IS = (
    "a DNS-1123 label (lower-case letters, digits and '-', at most 63, starting and ending with"
    " a letter or digit)"
)
_SUBDOMAIN_IS = (
    "a DNS-1123 subdomain (lower-case letters, digits, '-' and '.', at most 253, each"
    " dot-separated part starting and ending with a letter or digit)"
)
_SLURM_ID_IS = (
    "a Slurm job id as squeue prints it (<job>, <job>_<task> or <job>+<offset>, without leading"
    " zeros)"
)


def _unless(sound: bool, text: str, what: str) -> str | None:
    """None when ``text`` is ``sound``, else the sentence that it is not ``what``."""
    return None if sound else f"{text!r} is not {what}"


def dns1123_label_problem(name: str) -> str | None:
    """Why ``name`` is not a DNS-1123 label (a Kubernetes namespace), or None."""
    return _unless(bool(_DNS1123_LABEL.fullmatch(name)), name, _LABEL_IS)


def dns1123_subdomain_problem(name: str) -> str | None:
    """Why ``name`` is not a DNS-1123 subdomain (a Kubernetes object name), or None."""
    parts = all(_SUBDOMAIN_PART.fullmatch(p) for p in name.split("."))
    return _unless(bool(_DNS1123_SUBDOMAIN.fullmatch(name)) and parts, name, _SUBDOMAIN_IS)


def slurm_id_problem(slurm_id: str) -> str | None:
    """Why ``slurm_id`` (after ``slurm:``) is not a Slurm job id as squeue prints it, or None."""
    return _unless(bool(SLURM_ID.fullmatch(slurm_id)), slurm_id, _SLURM_ID_IS)


def kubernetes_id_problem(rest: str) -> str | None:
    """Why ``rest`` (after ``k8s:``) is neither ``<namespace>/<pod>`` nor a pod name or uid
    (what an exporter without the namespace gives) with valid names, or None."""
    namespace, slash, pod = rest.rpartition("/")
    if slash and (problem := dns1123_label_problem(namespace)) is not None:
        return problem
    return dns1123_subdomain_problem(pod)


def job_id_problem(job_id: str) -> str | None:
    """Why ``job_id`` may not name a job (a control character; for ``slurm:`` and ``k8s:`` ids,
    not the scheduler's canonical spelling), or None."""
    problem = control_problem(job_id)
    if problem is not None:
        return problem
    prefix, colon, rest = job_id.partition(":")
    if not colon:
        return None
    if prefix == "slurm":
        return slurm_id_problem(rest)
    if prefix in KUBERNETES_PREFIXES:
        return kubernetes_id_problem(rest)
    return None
