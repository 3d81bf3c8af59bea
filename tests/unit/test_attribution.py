"""Job attribution against fake /proc trees laid out as Slurm and Kubernetes lay them out."""

from __future__ import annotations

import os
from pathlib import Path

from service.collectors.attribution import JobAttributor, job_from_cgroup, job_from_environ
from tests.unit.attribution_support import SLURM_V2, make_proc

SLURM_V1 = (
    "12:memory:/slurm/uid_1000/job_4242/step_0/task_0\n"
    "11:devices:/slurm/uid_1000/job_4242/step_0\n"
    "1:name=systemd:/system.slice/slurmd.service\n"
)
K8S_CGROUPFS = (
    "0::/kubepods/burstable/pod5f0c1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b/"
    "9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a1f0e9d8c\n"
)
K8S_SYSTEMD = (
    "0::/kubepods.slice/kubepods-besteffort.slice/"
    "kubepods-besteffort-pod1b2c3d4e_5f60_4a7b_8c9d_0e1f2a3b4c5d.slice/"
    "cri-containerd-0123456789abcdef.scope\n"
)


def test_slurm_cgroup_v1_and_v2_paths_give_the_job_id():
    assert job_from_cgroup(SLURM_V1) == "slurm:4242"
    assert job_from_cgroup(SLURM_V2) == "slurm:90210"


def test_kubernetes_pod_uid_from_cgroupfs_and_systemd_drivers():
    assert job_from_cgroup(K8S_CGROUPFS) == "k8s:5f0c1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b"
    assert job_from_cgroup(K8S_SYSTEMD) == "k8s:1b2c3d4e-5f60-4a7b-8c9d-0e1f2a3b4c5d"


def test_a_plain_login_session_has_no_job():
    assert job_from_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n") is None


def test_environ_gives_slurm_job_and_user():
    raw = b"PATH=/bin\0SLURM_JOB_ID=777\0SLURM_JOB_USER=alice\0"
    assert job_from_environ(raw) == ("slurm:777", "alice")
    assert job_from_environ(b"PATH=/bin\0") == (None, None)


def test_attributor_prefers_cgroup_then_environ_then_mapping_dir(tmp_path: Path):
    proc = tmp_path / "proc"
    make_proc(proc, 100, cgroup=SLURM_V2, environ={"SLURM_JOB_ID": "1", "SLURM_JOB_USER": "bob"})
    make_proc(proc, 200, environ={"SLURM_JOB_ID": "555", "SLURM_JOB_USER": "carol"})
    make_proc(proc, 300, uid=os.getuid())
    jobmap = tmp_path / "jobmap"
    jobmap.mkdir()
    (jobmap / "3").write_text("\ntrain-llm-7\nother\n")
    a = JobAttributor(proc_root=proc, job_map_dir=jobmap)
    assert a.attribute(100, 0).job_id == "slurm:90210"  # the cgroup wins over environ
    assert a.attribute(100, 0).user == "bob"
    got = a.attribute(200, 0)
    assert (got.job_id, got.user) == ("slurm:555", "carol")
    mapped = a.attribute(300, 3)
    assert mapped.job_id == "train-llm-7"
    assert mapped.user is not None  # from the Uid line of status


def test_vanished_or_unreadable_process_is_unattributed_not_an_error(tmp_path: Path):
    a = JobAttributor(proc_root=tmp_path)
    got = a.attribute(999, None)
    assert got.job_id is None and got.user is None


def test_results_are_cached_while_the_pid_lives_and_dropped_after(tmp_path: Path):
    make_proc(tmp_path, 42, cgroup=SLURM_V1)
    a = JobAttributor(proc_root=tmp_path)
    assert a.attribute(42).job_id == "slurm:4242"
    (tmp_path / "42" / "cgroup").write_text(SLURM_V2)  # pid reused by another job
    assert a.attribute(42).job_id == "slurm:4242"  # cached while seen every cycle
    a.forget_except(set())  # the pid was not seen in a cycle
    assert a.attribute(42).job_id == "slurm:90210"
