"""A real Slurm runs the shipped prolog and epilog: sbatch and salloc, seen at a real central.

Debian's slurm-wlm (slurmctld, slurmd, sbatch, salloc; 22.05 on bookworm) and munge, installed by
scripts/test-services.sh, run here as a one-node cluster on free loopback ports with
`PrologFlags=Alloc`. gres.conf declares four GPUs over character device nodes this fixture
creates (/dev/nvidiaN stand-ins: slurmd 22.05 drops plain files as "not a valid character or
block device", and then sets no SLURM_JOB_GPUS). Prolog and Epilog are the shipped scripts,
wrapped only to set their environment file (central URL, token, the /proc stand-in) and a PATH
with a stub nvidia-smi; the stand-ins are built from captured driver output
(tests/slurm_support.py). Needs root (slurmd, mknod), as CI runs.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine

from tests.slurm_support import (
    GPUS,
    ROOT,
    UUID_OF_MINOR,
    Cluster,
    know_gpus,
    slurm_cluster,
    wait_for_job,
)
from tests.support import FakeClock, free_port


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    yield from slurm_cluster(tmp_path_factory)


def test_sbatch_job_is_registered_with_its_gpus_and_ended(
    cluster: Cluster, server: str, http: httpx.Client, tokens, engine: Engine, clock: FakeClock
):
    know_gpus(engine, clock, [uuid for uuid, _, _ in GPUS])
    cluster.point_at(server, tokens["agent"])
    slurm_id = cluster.run(
        "sbatch", "--parsable", "--account=vision", "--comment=project=resnet50",
        "--gres=gpu:2", "--output=/dev/null", "--wrap", "sleep 2",
    ).strip()  # fmt: skip

    job = wait_for_job(http, tokens["reader"], f"slurm:{slurm_id}", ended=False)
    assert (job["user"], job["team"], job["project"]) == ("root", "vision", "resnet50")
    labels = job["labels"]
    assert {k: labels.pop(k) for k in ("partition", "cluster", "account")} == {
        "partition": "gpu",
        "cluster": "gwtest",
        "account": "vision",
    }
    # The job's name where slurmd passes it to the Prolog (its work key's name).
    assert labels in ({}, {"name": "wrap"})
    # Slurm hands out /dev/nvidia0 and /dev/nvidia1: the GPUs of device minors 0 and 1.
    assert sorted(g["gpu_uuid"] for g in job["gpus"]) == sorted(
        [UUID_OF_MINOR[0], UUID_OF_MINOR[1]]
    )
    assert all(g["ended_at"] is None for g in job["gpus"])

    job = wait_for_job(http, tokens["reader"], f"slurm:{slurm_id}", ended=True)
    assert all(g["ended_at"] == job["ended_at"] for g in job["gpus"])
    assert all(g["started_at"] < g["ended_at"] for g in job["gpus"])


def test_salloc_that_runs_nothing_is_registered_until_cancelled(
    cluster: Cluster, server: str, http: httpx.Client, tokens, engine: Engine, clock: FakeClock
):
    # The idle-held waste GPU Warden exists for: GPUs allocated, nothing started on them.
    know_gpus(engine, clock, [uuid for uuid, _, _ in GPUS])
    cluster.point_at(server, tokens["agent"])
    out = cluster.run(
        "salloc", "--no-shell", "--account=nlp", "--gres=gpu:1", "--job-name=notebook"
    )
    del out  # salloc reports the job id on stderr
    (slurm_id,) = cluster.run("squeue", "-h", "-n", "notebook", "-o", "%i").split()
    job = wait_for_job(http, tokens["reader"], f"slurm:{slurm_id}", ended=False)
    assert job["team"] == "nlp" and len(job["gpus"]) == 1
    assert job["gpus"][0]["gpu_uuid"] in UUID_OF_MINOR.values()

    cluster.run("scancel", slurm_id)
    job = wait_for_job(http, tokens["reader"], f"slurm:{slurm_id}", ended=True)
    assert job["gpus"][0]["ended_at"] == job["ended_at"]


def test_the_comment_can_come_from_scontrol_where_slurm_does_not_pass_it(
    cluster: Cluster, server: str, http: httpx.Client, tokens, engine: Engine, clock: FakeClock
):
    # Some Slurm versions give a Prolog no SLURM_JOB_COMMENT; GPUWARDEN_SLURM_SCONTROL=yes asks
    # the real controller. The prolog is run here by hand for a job the cluster really has.
    know_gpus(engine, clock, [uuid for uuid, _, _ in GPUS])
    slurm_id = cluster.run(
        "sbatch", "--parsable", "--comment=project=from-scontrol", "--output=/dev/null",
        "--wrap", "sleep 30",
    ).strip()  # fmt: skip
    try:
        env = {
            "SLURM_CONF": cluster.env["SLURM_CONF"],
            "PATH": str(cluster.base / "bin"),
            "GPUWARDEN_ENV_FILE": str(cluster.base / "missing.env"),
            "GPUWARDEN_CENTRAL_URL": server,
            "GPUWARDEN_AGENT_TOKEN": tokens["agent"],
            "GPUWARDEN_NVIDIA_PROC": str(cluster.proc_dir),
            "GPUWARDEN_SLURM_SCONTROL": "yes",
            "SLURM_JOB_ID": slurm_id,
            "SLURM_JOB_USER": "root",
            "SLURM_JOB_GPUS": "3",
        }
        done = subprocess.run(
            ["/bin/bash", str(ROOT / "deploy" / "slurm" / "prolog.sh")],
            env=env, capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert done.returncode == 0 and done.stderr == "", done.stderr
        job = wait_for_job(http, tokens["reader"], f"slurm:{slurm_id}", ended=False)
        assert job["project"] == "from-scontrol"
        assert [g["gpu_uuid"] for g in job["gpus"]] == [UUID_OF_MINOR[3]]
    finally:
        cluster.run("scancel", slurm_id, check=False)


def test_a_control_character_in_the_comment_still_registers_the_job(
    cluster: Cluster, server: str, http: httpx.Client, tokens, engine: Engine, clock: FakeClock
):
    # A comment pasted from a terminal or a script can carry an escape or a ^A; the job must be
    # registered all the same, the control character read as a separator between words.
    know_gpus(engine, clock, [uuid for uuid, _, _ in GPUS])
    cluster.point_at(server, tokens["agent"])
    slurm_id = cluster.run(
        "sbatch", "--parsable", "--account=vision", "--comment=project=resnet50\x01team=nlp\x1b",
        "--gres=gpu:1", "--output=/dev/null", "--wrap", "sleep 2",
    ).strip()  # fmt: skip
    job = wait_for_job(http, tokens["reader"], f"slurm:{slurm_id}", ended=False)
    assert (job["team"], job["project"]) == ("nlp", "resnet50")
    assert len(job["gpus"]) == 1


def test_a_job_whose_epilog_was_lost_is_ended_by_the_next_prolog_on_its_gpus(
    cluster: Cluster, server: str, http: httpx.Client, tokens, engine: Engine, clock: FakeClock,
    tmp_path: Path,
):  # fmt: skip
    """Job A holds every GPU; its epilog is lost (central unreachable, no agent to hand the end
    to). Job B then gets one of those GPUs: its prolog ends A there, so B does not share its
    GPU time and bill with a ghost."""
    know_gpus(engine, clock, [uuid for uuid, _, _ in GPUS])
    cluster.point_at(server, tokens["agent"])
    a = cluster.run(
        "sbatch", "--parsable", "--gres=gpu:4", "--output=/dev/null", "--wrap", "sleep 3"
    ).strip()  # fmt: skip
    wait_for_job(http, tokens["reader"], f"slurm:{a}", ended=False)
    # The epilog finds central unreachable and a job-end folder no agent reads.
    cluster.point_at("http://127.0.0.1:9", tokens["agent"], job_ends=tmp_path / "nobody-reads")
    cluster.wait_gone(a)
    ghost = wait_for_job(http, tokens["reader"], f"slurm:{a}", ended=False)
    assert len(ghost["gpus"]) == 4 and all(g["ended_at"] is None for g in ghost["gpus"])
    assert list((tmp_path / "nobody-reads").iterdir())  # the end was handed over, not lost

    cluster.point_at(server, tokens["agent"])
    b = cluster.run(
        "sbatch", "--parsable", "--gres=gpu:1", "--output=/dev/null", "--wrap", "sleep 30"
    ).strip()  # fmt: skip
    try:
        second = wait_for_job(http, tokens["reader"], f"slurm:{b}", ended=False)
        (held,) = second["gpus"]
        # Registered with B, in the same request: A ends on B's GPU when B starts; its other
        # GPUs (no later job on them yet) stay open until a job comes to each.
        ghost = wait_for_job(http, tokens["reader"], f"slurm:{a}", ended=False)
        by_gpu = {g["gpu_uuid"]: g["ended_at"] for g in ghost["gpus"]}
        assert by_gpu.pop(held["gpu_uuid"]) == held["started_at"]
        assert set(by_gpu.values()) == {None}
    finally:
        cluster.run("scancel", b, check=False)
        cluster.wait_gone(b)


def test_an_epilog_during_a_central_outage_is_shipped_by_the_agent_when_central_is_back(
    cluster: Cluster, app, tokens, engine: Engine, clock: FakeClock, tmp_path: Path
):
    from service.collectors.simulated import SimulatedBackend
    from tests.agent_support import Wire, make_agent
    from tests.support import live_server

    know_gpus(engine, clock, [uuid for uuid, _, _ in GPUS])
    ends = tmp_path / "job-ends"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cluster.point_at(url, tokens["agent"], job_ends=ends)
    with live_server(app, port=port), httpx.Client(base_url=url, timeout=30) as http:
        slurm_id = cluster.run(
            "sbatch", "--parsable", "--gres=gpu:1", "--output=/dev/null", "--wrap", "sleep 4"
        ).strip()  # fmt: skip
        wait_for_job(http, tokens["reader"], f"slurm:{slurm_id}", ended=False)
    # Central is down when the job ends: the epilog hands the end to the agent's folder.
    cluster.wait_gone(slurm_id)
    (left,) = ends.iterdir()
    handed = json.loads(left.read_text())
    assert handed["job_id"] == f"slurm:{slurm_id}"
    (tmp_path / "agent").mkdir()
    agent = make_agent(tmp_path / "agent", url=url, token=tokens["agent"], clock=clock,
                       backend=SimulatedBackend(hostname="node-a", gpus=1, start=clock()),
                       wire=Wire())  # fmt: skip
    agent.config = replace(agent.config, job_end_dir=ends)
    try:
        agent.run_once()  # central still down: the end moves into the spool and waits
        assert not left.exists() and len(agent.spool.job_ends()) == 1
        agent.run_once()
        assert len(agent.spool.job_ends()) == 1
        with live_server(app, port=port), httpx.Client(base_url=url, timeout=30) as http:
            agent.run_once()
            assert agent.spool.job_ends() == []
            job = wait_for_job(http, tokens["reader"], f"slurm:{slurm_id}", ended=True)
    finally:
        agent.close()
    # The end Slurm's epilog saw, not when central came back.
    (gpu,) = job["gpus"]
    assert gpu["ended_at"] == job["ended_at"] and gpu["started_at"] < gpu["ended_at"]
    assert datetime.fromisoformat(job["ended_at"]) == datetime.fromisoformat(handed["ended_at"])
