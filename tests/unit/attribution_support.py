"""A /proc stand-in's processes, as the attribution tests build them."""

from __future__ import annotations

from pathlib import Path

SLURM_V2 = "0::/system.slice/slurmstepd.scope/job_90210/step_batch/user/task_0\n"


def make_proc(
    root: Path,
    pid: int,
    *,
    cgroup: str = "0::/user.slice/user-1000.slice/session-3.scope\n",
    environ: dict[str, str] | None = None,
    uid: int = 0,
) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "cgroup").write_text(cgroup)
    env = environ or {"PATH": "/usr/bin", "HOME": "/root"}
    (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0")
    (d / "status").write_text(f"Name:\tpython\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
