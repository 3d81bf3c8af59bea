"""Which job a GPU process belongs to: the kubelet's pod resources, cgroup path, SLURM_JOB_ID in
its environment, or a job map.

On a Kubernetes node the kubelet's pod-resources socket says which pods each GPU is allocated to
(``k8s:<namespace>/<pod>``), read once per cycle. A GPU held by one pod needs no /proc, so the
agent needs no ``hostPID``; on a GPU several pods share (time-slicing, MPS) a process is matched
to its pod by the ``HOSTNAME`` in its environment where the agent can read it (``hostPID``), and
is left without a job otherwise. Elsewhere it reads a /proc tree (``proc_root``, a fake one in
tests) and an optional dcgm-exporter-style job mapping directory (one file per GPU index, each
holding job ids one per line). /proc results are cached per pid for as long as the pid keeps
showing up, so a steady process costs no file reads per cycle.
"""

from __future__ import annotations

import contextlib
import logging
import pwd
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from service.collectors.backend import Device
from service.collectors.kubelet.podresources import (
    PodDevice,
    PodResourcesClient,
    PodResourcesError,
)
from service.wire import control_problem

log = logging.getLogger(__name__)

# Slurm: cgroup v1 ".../slurm/uid_1000/job_4242/step_0/task_0", cgroup v2
# ".../slurmstepd.scope/job_4242/step_0/user/task_0".
_SLURM_CGROUP = re.compile(r"/job_(\d+)(?:/|$)")
# Kubernetes, cgroupfs driver: "/kubepods/burstable/pod1b7f...-...-.../<container>";
# systemd driver: ".../kubepods-burstable-pod1b7f..._..._....slice/cri-containerd-<id>.scope".
_K8S_CGROUP = re.compile(
    r"kubepods[^\n]*?pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
)


@dataclass(frozen=True, slots=True)
class Attribution:
    """A process's job id (``slurm:<id>``, ``k8s:<pod uid>`` or a mapped id) and user name."""

    job_id: str | None
    user: str | None


def job_from_cgroup(text: str) -> str | None:
    """The job id named by the contents of a /proc/<pid>/cgroup file, if any."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        m = _SLURM_CGROUP.search(path)
        if m:
            return f"slurm:{m.group(1)}"
        m = _K8S_CGROUP.search(path)
        if m:
            return "k8s:" + m.group(1).replace("_", "-")
    return None


def _clean(value: str | None) -> str | None:
    """``value``, or None when it holds a control character: central refuses the whole batch
    for one (422), so a process that sets its own SLURM_JOB_ID to ``1\\r\\nBcc: ...`` would
    otherwise have every batch of its node thrown away."""
    return None if value is None or control_problem(value) is not None else value


def job_from_environ(raw: bytes) -> tuple[str | None, str | None]:
    """SLURM_JOB_ID and SLURM_JOB_USER from the NUL-separated bytes of /proc/<pid>/environ
    (None for a value with a control character)."""
    job = user = None
    for item in raw.split(b"\0"):
        if item.startswith(b"SLURM_JOB_ID="):
            job = "slurm:" + item[13:].decode(errors="replace")
        elif item.startswith(b"SLURM_JOB_USER="):
            user = item[15:].decode(errors="replace")
    return _clean(job), _clean(user)


def hostname_from_environ(raw: bytes) -> str | None:
    """HOSTNAME from the NUL-separated bytes of /proc/<pid>/environ (a pod's name, by default)."""
    for item in raw.split(b"\0"):
        if item.startswith(b"HOSTNAME="):
            return item[9:].decode(errors="replace") or None
    return None


def pod_hostname(pod: str) -> str:
    """The hostname the kubelet gives a pod without ``spec.hostname``: its name, cut to 63
    characters without a trailing ``-`` or ``.``."""
    return pod[:63].rstrip("-.") if len(pod) > 63 else pod


def _user_of_uid(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class JobAttributor:
    """Maps GPU processes to jobs from a /proc tree and an optional job mapping directory."""

    def __init__(
        self,
        *,
        proc_root: Path = Path("/proc"),
        job_map_dir: Path | None = None,
        pods: PodResourcesClient | None = None,
    ):
        self.proc_root = proc_root
        self.job_map_dir = job_map_dir
        self.pods = pods
        self._cache: dict[int, Attribution] = {}
        self._pods_by_uuid: dict[str, list[PodDevice]] = {}
        self._pods_by_index: dict[int, list[PodDevice]] = {}
        self._hostnames: dict[int, str | None] = {}  # pid -> HOSTNAME, read once per pid
        self._pods_active = False  # the socket answered at least once
        self._pods_failing = False
        self._dra_unknown: set[str] = set()  # DRA device names already logged as no GPU here

    def refresh(self, devices: Sequence[Device] = ()) -> None:
        """Read the kubelet's device allocations once for this cycle (no-op off Kubernetes).

        ``devices`` are this node's GPUs: a DRA allocation names a GPU gpu-<minor>, which
        their minor numbers resolve. A failed read keeps the last answer (the kubelet restarts
        now and then) and is logged when it starts and when it ends, not every cycle.
        """
        if self.pods is None or not self.pods.available():
            return
        try:
            allocated = self.pods.list()
        except PodResourcesError as exc:
            if not self._pods_failing:
                log.warning("%s; keeping the last pod allocations", exc)
            self._pods_failing = True
            return
        if self._pods_failing:
            log.info("kubelet pod-resources socket answers again")
        self._pods_failing = False
        self._pods_active = True
        by_uuid: dict[str, list[PodDevice]] = {}
        by_index: dict[int, list[PodDevice]] = {}
        dra_names = {
            f"gpu-{g.minor}": g.alias or g.uuid
            for g in devices
            if g.minor is not None and g.mig_parent_uuid is None
        }
        for d in allocated:
            if d.dra:
                uuid = dra_names.get(d.device_id)
                if uuid is not None:
                    by_uuid.setdefault(uuid, []).append(d)
                elif d.device_id not in self._dra_unknown:
                    self._dra_unknown.add(d.device_id)
                    log.warning(
                        "pod %s/%s holds DRA device %s of %s, which no GPU of this node is"
                        " (its minor number names none): that allocation has no GPU here",
                        d.namespace, d.pod, d.device_id, d.resource,
                    )  # fmt: skip
                continue
            # Time-slicing and MPS replicas are "GPU-<uuid>::<n>" (or "MIG-<uuid>::<n>"), one
            # or more per pod: every pod holding one is a tenant of the GPU. The index strategy
            # names GPUs "0".."7".
            base = d.device_id.split("::", 1)[0]
            if base.isdigit():
                by_index.setdefault(int(base), []).append(d)
            else:
                by_uuid.setdefault(base, []).append(d)
        self._pods_by_uuid, self._pods_by_index = by_uuid, by_index

    def _pods_on(self, gpu_uuid: str | None, gpu_index: int | None) -> list[PodDevice]:
        """The kubelet's allocations of this GPU, one per pod (a pod's first listed)."""
        found = self._pods_by_uuid.get(gpu_uuid, []) if gpu_uuid is not None else []
        if not found and gpu_index is not None:
            found = self._pods_by_index.get(gpu_index, [])
        one: dict[str, PodDevice] = {}
        for d in found:  # a pod with several containers or replicas of the GPU is one tenant
            one.setdefault(d.job_id, d)
        return list(one.values())

    def pod_jobs(self, gpu_uuid: str, gpu_index: int | None = None) -> list[str]:
        """``k8s:<namespace>/<pod>`` of every pod the kubelet allocated this GPU to, in the
        kubelet's order (several under time-slicing or MPS)."""
        return [d.job_id for d in self._pods_on(gpu_uuid, gpu_index)]

    def pod_job(self, gpu_uuid: str, gpu_index: int | None = None) -> str | None:
        """The pod's job if the kubelet allocated this GPU to exactly one pod, else None."""
        jobs = self.pod_jobs(gpu_uuid, gpu_index)
        return jobs[0] if len(jobs) == 1 else None

    @property
    def reports_held_gpus(self) -> bool:
        """Whether a GPU can have a job with no process on it (pod allocations, job map)."""
        return self._pods_active or self.job_map_dir is not None

    def device_jobs(self, gpu_uuid: str, gpu_index: int) -> list[str]:
        """The jobs holding a GPU whether or not a process runs on it: its pods, else the job
        map's."""
        pods = self.pod_jobs(gpu_uuid, gpu_index)
        if pods:
            return pods
        mapped = self.mapped_job(gpu_index)
        return [] if mapped is None else [mapped]

    def attribute(
        self, pid: int, gpu_index: int | None = None, gpu_uuid: str | None = None
    ) -> Attribution:
        """The job and user of ``pid`` on a GPU (cached while the pid stays alive).

        On Kubernetes the pod the GPU is allocated to wins and /proc is not read. On a GPU
        several pods hold, the process's pod is the one named by its ``HOSTNAME``; without
        ``hostPID`` the agent's /proc is its own pid namespace, where a host pid names none of
        those pods (or no process at all), so the process is left without a job rather than
        given to a pod it may not belong to.
        """
        if self._pods_active:
            pods = self._pods_on(gpu_uuid, gpu_index) if gpu_uuid is not None else []
            if len(pods) == 1:
                return Attribution(pods[0].job_id, None)
            if pods:
                return Attribution(self._pod_of(pid, pods), None)
            return Attribution(self._mapped(gpu_index), None)
        hit = self._cache.get(pid)
        if hit is not None:
            return hit
        found = self._lookup(pid, gpu_index)
        self._cache[pid] = found
        return found

    def forget_except(self, alive: set[int]) -> None:
        """Drop cached pids that were not seen this cycle (a reused pid is looked up afresh)."""
        if len(self._cache) != len(alive) or any(p not in alive for p in self._cache):
            self._cache = {p: a for p, a in self._cache.items() if p in alive}
        if any(p not in alive for p in self._hostnames):
            self._hostnames = {p: h for p, h in self._hostnames.items() if p in alive}

    def _pod_of(self, pid: int, pods: list[PodDevice]) -> str | None:
        """The job of the one pod among ``pods`` whose hostname is the process's HOSTNAME."""
        if pid not in self._hostnames:
            try:
                raw = (self.proc_root / str(pid) / "environ").read_bytes()
                self._hostnames[pid] = hostname_from_environ(raw)
            except OSError:  # not in our pid namespace, ended, or not ours to read
                self._hostnames[pid] = None
        host = self._hostnames[pid]
        if host is None:
            return None
        match = {d.job_id for d in pods if pod_hostname(d.pod) == host}
        return match.pop() if len(match) == 1 else None  # same name in two namespaces: unknown

    def _lookup(self, pid: int, gpu_index: int | None) -> Attribution:
        base = self.proc_root / str(pid)
        job: str | None = None
        user: str | None = None
        # OSError: the process ended, or /proc is not ours to read.
        with contextlib.suppress(OSError):
            job = job_from_cgroup((base / "cgroup").read_text())
        try:
            env_job, user = job_from_environ((base / "environ").read_bytes())
            job = job or env_job
        except OSError:
            pass  # environ of another user's process is unreadable without privileges
        if user is None:
            user = self._uid_user(base)
        return Attribution(job or self._mapped(gpu_index), user)

    def _mapped(self, gpu_index: int | None) -> str | None:
        return None if gpu_index is None else self.mapped_job(gpu_index)

    def _uid_user(self, base: Path) -> str | None:
        try:
            for line in (base / "status").read_text().splitlines():
                if line.startswith("Uid:"):
                    return _user_of_uid(int(line.split()[1]))
        except (OSError, ValueError, IndexError):
            pass
        return None

    def mapped_job(self, gpu_index: int) -> str | None:
        """The job the mapping directory assigns to GPU ``gpu_index`` (the first listed)."""
        if self.job_map_dir is None:
            return None
        try:
            text = (self.job_map_dir / str(gpu_index)).read_text()
        except OSError:
            return None
        for line in text.splitlines():
            if line.strip():
                return _clean(line.strip())
        return None
