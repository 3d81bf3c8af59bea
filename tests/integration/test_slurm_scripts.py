"""deploy/slurm prolog and epilog register and end a job through the API with curl."""

from __future__ import annotations

import os
import subprocess
from datetime import timedelta
from pathlib import Path

import httpx
from sqlalchemy import Engine

from service.clock import utc_now
from tests.conftest import make_token
from tests.integration.cost_data import store_series
from tests.support import FakeClock

ROOT = Path(__file__).resolve().parents[2]


def run_script(name: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(ROOT / "deploy" / "slurm" / name)],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def fake_nvidia_smi(tmp_path: Path, prefix: str) -> Path:
    """A stand-in answering like nvidia-smi -i 0,2 --query-gpu=uuid: one uuid per index."""
    fake_smi = tmp_path / f"nvidia-smi-{prefix}"
    fake_smi.write_text(
        '#!/usr/bin/env bash\nfor a in "$@"; do prev=$cur; cur=$a;'
        ' [ "$prev" = -i ] && idx=$a; done\n'
        f'IFS=, read -ra ids <<< "$idx"; for i in "${{ids[@]}}"; do echo "{prefix}$i"; done\n'
    )
    fake_smi.chmod(0o755)
    return fake_smi


def test_prolog_registers_and_epilog_ends_the_job(
    server: str, http: httpx.Client, tokens, engine: Engine, clock: FakeClock, tmp_path: Path
):
    # The scripts date the job with the machine's clock; agent tokens may only date starts
    # after their GPUs were first seen, so the service's clock follows the real one here.
    clock.set(utc_now().replace(microsecond=0) - timedelta(minutes=5))
    for i, uuid in enumerate(("GPU-a0", "GPU-a1", "GPU-a2")):
        store_series(engine, clock, uuid=uuid, index=i, start=clock(), metrics=[{"sm_active": 0.1}])
    clock.advance(300)
    env = {
        "GPUWARDEN_ENV_FILE": str(tmp_path / "missing.env"),
        "GPUWARDEN_CENTRAL_URL": server,
        "GPUWARDEN_AGENT_TOKEN": tokens["agent"],
        "GPUWARDEN_NVIDIA_SMI": str(fake_nvidia_smi(tmp_path, "GPU-a")),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_USER": 'ali"ce',
        "SLURM_JOB_ACCOUNT": "vision",
        "SLURM_JOB_NAME": "train-resnet",
        "SLURM_JOB_PARTITION": "gpu",
        "SLURM_JOB_GPUS": "0,2",
    }
    done = run_script("prolog.sh", env)
    assert done.returncode == 0, done.stderr
    reader = {"Authorization": f"Bearer {tokens['reader']}"}
    job = http.get("/api/v1/jobs/slurm:4242", headers=reader).json()
    assert (job["user"], job["team"], job["project"]) == ('ali"ce', "vision", "train-resnet")
    assert job["labels"] == {"partition": "gpu"}
    assert sorted(g["gpu_uuid"] for g in job["gpus"]) == ["GPU-a0", "GPU-a2"]
    assert job["ended_at"] is None

    done = run_script("epilog.sh", env)
    assert done.returncode == 0, done.stderr
    job = http.get("/api/v1/jobs/slurm:4242", headers=reader).json()
    assert job["ended_at"] is not None
    assert all(g["ended_at"] == job["ended_at"] for g in job["gpus"])


def test_each_node_of_a_multi_node_job_adds_and_ends_its_own_gpus(
    server: str, http: httpx.Client, tokens, engine: Engine, clock: FakeClock, tmp_path: Path
):
    clock.set(utc_now().replace(microsecond=0) - timedelta(minutes=5))
    for node, prefix in (("node-a", "GPU-a"), ("node-b", "GPU-b")):
        for i in range(2):
            store_series(
                engine,
                clock,
                uuid=f"{prefix}{i}",
                index=i,
                start=clock(),
                metrics=[{"sm_active": 0.1}],
                hostname=node,
            )
    clock.advance(300)
    node_b_token = make_token(engine, "agent", "node-b")
    common = {
        "GPUWARDEN_ENV_FILE": str(tmp_path / "missing.env"),
        "GPUWARDEN_CENTRAL_URL": server,
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_ACCOUNT": "vision",
        "SLURM_JOB_NAME": "big",
        "SLURM_JOB_PARTITION": "gpu",
        "SLURM_JOB_GPUS": "0,1",
    }
    env_a = {
        **common,
        "GPUWARDEN_AGENT_TOKEN": tokens["agent"],
        "GPUWARDEN_NVIDIA_SMI": str(fake_nvidia_smi(tmp_path, "GPU-a")),
    }
    env_b = {
        **common,
        "GPUWARDEN_AGENT_TOKEN": node_b_token,
        "GPUWARDEN_NVIDIA_SMI": str(fake_nvidia_smi(tmp_path, "GPU-b")),
    }
    reader = {"Authorization": f"Bearer {tokens['reader']}"}
    for env in (env_a, env_b):
        done = run_script("prolog.sh", env)
        assert done.returncode == 0 and not done.stderr, done.stderr
    job = http.get("/api/v1/jobs/slurm:77", headers=reader).json()
    assert sorted(g["gpu_uuid"] for g in job["gpus"]) == ["GPU-a0", "GPU-a1", "GPU-b0", "GPU-b1"]

    # Node a's epilog ends node a's part only; the job ends with its last node.
    assert run_script("epilog.sh", env_a).returncode == 0
    job = http.get("/api/v1/jobs/slurm:77", headers=reader).json()
    assert job["ended_at"] is None
    assert {g["gpu_uuid"] for g in job["gpus"] if g["ended_at"] is None} == {"GPU-b0", "GPU-b1"}
    done = run_script("epilog.sh", env_b)
    assert done.returncode == 0 and not done.stderr, done.stderr
    job = http.get("/api/v1/jobs/slurm:77", headers=reader).json()
    assert job["ended_at"] is not None
    assert all(g["ended_at"] is not None for g in job["gpus"])


def test_scripts_never_fail_the_job(tmp_path: Path):
    env = {
        "GPUWARDEN_ENV_FILE": str(tmp_path / "missing.env"),
        "GPUWARDEN_CENTRAL_URL": "http://127.0.0.1:9",  # nothing listens there
        "GPUWARDEN_AGENT_TOKEN": "gw_x",
        "GPUWARDEN_NVIDIA_SMI": "true",
        "SLURM_JOB_ID": "1",
        "SLURM_JOB_GPUS": "0",
    }
    for name in ("prolog.sh", "epilog.sh"):
        assert run_script(name, env).returncode == 0
