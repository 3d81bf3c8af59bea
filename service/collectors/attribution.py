"""Which job a GPU process belongs to: cgroup path, SLURM_JOB_ID in its environment, or a job map.

Reads a /proc tree (``proc_root``, a fake one in tests) and an optional dcgm-exporter-style job
mapping directory (one file per GPU index, each holding job ids one per line). Results are cached
per pid for as long as the pid keeps showing up, so a steady process costs no file reads per cycle.
"""

from __future__ import annotations

import contextlib
import logging
import pwd
import re
from dataclasses import dataclass
from pathlib import Path

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


def job_from_environ(raw: bytes) -> tuple[str | None, str | None]:
    """SLURM_JOB_ID and SLURM_JOB_USER from the NUL-separated bytes of /proc/<pid>/environ."""
    job = user = None
    for item in raw.split(b"\0"):
        if item.startswith(b"SLURM_JOB_ID="):
            job = "slurm:" + item[13:].decode(errors="replace")
        elif item.startswith(b"SLURM_JOB_USER="):
            user = item[15:].decode(errors="replace")
    return job, user


def _user_of_uid(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class JobAttributor:
    """Maps GPU processes to jobs from a /proc tree and an optional job mapping directory."""

    def __init__(self, *, proc_root: Path = Path("/proc"), job_map_dir: Path | None = None):
        self.proc_root = proc_root
        self.job_map_dir = job_map_dir
        self._cache: dict[int, Attribution] = {}

    def attribute(self, pid: int, gpu_index: int | None = None) -> Attribution:
        """The job and user of ``pid`` (cached while the pid stays alive)."""
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
        if job is None and gpu_index is not None:
            job = self.mapped_job(gpu_index)
        return Attribution(job, user)

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
                return line.strip()
        return None
