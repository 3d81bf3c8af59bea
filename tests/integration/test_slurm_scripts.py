"""deploy/slurm prolog and epilog register and end a job through the API with curl."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
from sqlalchemy import Engine

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


def test_prolog_registers_and_epilog_ends_the_job(
    server: str, http: httpx.Client, tokens, engine: Engine, clock: FakeClock, tmp_path: Path
):
    for i, uuid in enumerate(("GPU-a0", "GPU-a1", "GPU-a2")):
        store_series(engine, clock, uuid=uuid, index=i, start=clock(), metrics=[{"sm_active": 0.1}])
    fake_smi = tmp_path / "nvidia-smi"
    # Answers like nvidia-smi -i 0,2 --query-gpu=uuid: one uuid per requested index.
    fake_smi.write_text(
        '#!/usr/bin/env bash\nfor a in "$@"; do prev=$cur; cur=$a;'
        ' [ "$prev" = -i ] && idx=$a; done\n'
        'IFS=, read -ra ids <<< "$idx"; for i in "${ids[@]}"; do echo "GPU-a$i"; done\n'
    )
    fake_smi.chmod(0o755)
    env = {
        "GPUWARDEN_ENV_FILE": str(tmp_path / "missing.env"),
        "GPUWARDEN_CENTRAL_URL": server,
        "GPUWARDEN_AGENT_TOKEN": tokens["agent"],
        "GPUWARDEN_NVIDIA_SMI": str(fake_smi),
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
