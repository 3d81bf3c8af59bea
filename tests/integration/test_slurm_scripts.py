"""deploy/slurm prolog and epilog, run as Slurm runs them, against a real central service.

GPU mapping reads real NVIDIA driver output (tests/data/nvidia); nvidia-smi is a stub printing
it. That the scripts return (how fast: bench/slurm.py) is checked against a central that accepts
connections and never answers.
The real Slurm (slurmctld, slurmd, sbatch, salloc) runs these scripts in test_slurm_real.py.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine

from tests.conftest import make_token
from tests.slurm_support import (
    CAPTURED_PROC,
    GTX_1080_TI,
    TITAN_X,
    fake_driver,
    know_gpus,
    smi_stub,
)
from tests.support import FakeClock

ROOT = Path(__file__).resolve().parents[2]


def run_script(
    name: str, env: dict[str, str], path: str | None = None
) -> subprocess.CompletedProcess[str]:
    # Slurm gives a Prolog no PATH at all; the scripts set their own.
    base = {"PATH": path} if path else {}
    return subprocess.run(
        ["bash", str(ROOT / "deploy" / "slurm" / name)],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def swapped_minors(tmp_path: Path) -> Path:
    """The captured host's /proc with the two device minors swapped (a valid driver state)."""
    proc, _ = fake_driver(
        tmp_path, [(GTX_1080_TI, "0000:17:00.0", 1), (TITAN_X, "0000:65:00.0", 0)]
    )
    return proc


def base_env(tmp_path: Path, server: str, token: str) -> dict[str, str]:
    return {
        "GPUWARDEN_ENV_FILE": str(tmp_path / "missing.env"),
        "GPUWARDEN_CENTRAL_URL": server,
        "GPUWARDEN_AGENT_TOKEN": token,
        "GPUWARDEN_NVIDIA_SMI": str(smi_stub(tmp_path / "bin")),
        "GPUWARDEN_NVIDIA_PROC": str(CAPTURED_PROC),
        "GPUWARDEN_SLURM_ACCOUNTS": str(tmp_path / "no-accounts"),
        "GPUWARDEN_JOB_END_DIR": str(tmp_path / "job-ends"),
        "SLURM_JOB_PARTITION": "gpu",
        "SLURM_CLUSTER_NAME": "hpc1",
    }


def get_job(http: httpx.Client, tokens, job_id: str) -> dict:  # type: ignore[type-arg]
    r = http.get(f"/api/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {tokens['reader']}"})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_prolog_registers_and_epilog_ends_the_job(
    server: str, http: httpx.Client, tokens, engine: Engine, clock: FakeClock, tmp_path: Path
):
    know_gpus(engine, clock, [GTX_1080_TI, TITAN_X])
    env = base_env(tmp_path, server, tokens["agent"]) | {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_USER": 'ali"ce',
        "SLURM_JOB_ACCOUNT": "vision",
        "SLURM_JOB_COMMENT": "project=resnet50, ticket 12",
        "SLURM_JOB_GPUS": "1",
    }
    done = run_script("prolog.sh", env)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    job = get_job(http, tokens, "slurm:4242")
    assert (job["user"], job["team"], job["project"]) == ('ali"ce', "vision", "resnet50")
    assert job["labels"] == {"partition": "gpu", "cluster": "hpc1", "account": "vision"}
    assert [g["gpu_uuid"] for g in job["gpus"]] == [TITAN_X]  # /dev/nvidia1
    assert job["ended_at"] is None

    done = run_script("epilog.sh", env)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    job = get_job(http, tokens, "slurm:4242")
    assert job["ended_at"] is not None
    assert all(g["ended_at"] == job["ended_at"] for g in job["gpus"])
    # Central took the end: nothing is left for the agent to send.
    assert list((tmp_path / "job-ends").iterdir()) == []


def test_a_job_on_gpus_a_job_never_ended_holds_ends_that_one_unless_shared_by_design(
    server: str, http: httpx.Client, tokens, engine: Engine, clock: FakeClock, tmp_path: Path
):
    know_gpus(engine, clock, [GTX_1080_TI, TITAN_X])
    env = base_env(tmp_path, server, tokens["agent"]) | {"SLURM_JOB_GPUS": "1"}
    for job in ("8001", "8002"):  # 8001's epilog never ran
        done = run_script("prolog.sh", env | {"SLURM_JOB_ID": job})
        assert done.returncode == 0 and done.stderr == "", done.stderr
    ghost, second = get_job(http, tokens, "slurm:8001"), get_job(http, tokens, "slurm:8002")
    assert ghost["ended_at"] is not None and ghost["ended_at"] == second["started_at"]
    assert second["ended_at"] is None
    # Slurm shards share one GPU by design: a shard job ends nobody.
    shards = env | {"SLURM_SHARDS_ON_NODE": "2"}
    for job in ("8003", "8004"):
        done = run_script("prolog.sh", shards | {"SLURM_JOB_ID": job})
        assert done.returncode == 0 and done.stderr == "", done.stderr
    assert get_job(http, tokens, "slurm:8002")["ended_at"] is None
    assert get_job(http, tokens, "slurm:8003")["ended_at"] is None


def test_minor_numbers_are_mapped_through_the_bus_not_the_index(
    server: str, http: httpx.Client, tokens, engine: Engine, clock: FakeClock, tmp_path: Path
):
    # /dev/nvidia0 on the second bus: nvidia-smi calls that GPU index 1.
    know_gpus(engine, clock, [GTX_1080_TI, TITAN_X])
    proc = swapped_minors(tmp_path)
    env = base_env(tmp_path, server, tokens["agent"]) | {
        "GPUWARDEN_NVIDIA_PROC": str(proc),
        "SLURM_JOB_ID": "5",
        "SLURM_JOB_USER": "bob",
        "SLURM_JOB_GPUS": "0",
    }
    done = run_script("prolog.sh", env)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert [g["gpu_uuid"] for g in get_job(http, tokens, "slurm:5")["gpus"]] == [TITAN_X]


def test_uuids_in_cuda_visible_devices_need_no_nvidia_smi(
    server: str, http: httpx.Client, tokens, engine: Engine, clock: FakeClock, tmp_path: Path
):
    # Slurm 25.11 gives the Prolog the allocated GPUs' UUIDs in CUDA_VISIBLE_DEVICES.
    know_gpus(engine, clock, [GTX_1080_TI, TITAN_X])
    env = base_env(tmp_path, server, tokens["agent"]) | {
        "GPUWARDEN_NVIDIA_SMI": str(tmp_path / "no-such-nvidia-smi"),
        "GPUWARDEN_NVIDIA_PROC": str(tmp_path / "no-proc"),
        "SLURM_JOB_ID": "2511",
        "SLURM_JOB_USER": "carol",
        "SLURM_JOB_GPUS": "0,1",
        "CUDA_VISIBLE_DEVICES": f"{GTX_1080_TI},{TITAN_X}",
    }
    done = run_script("prolog.sh", env)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    job = get_job(http, tokens, "slurm:2511")
    assert sorted(g["gpu_uuid"] for g in job["gpus"]) == sorted([GTX_1080_TI, TITAN_X])


def test_team_and_project_from_the_accounts_file_and_the_comment(
    server: str, http: httpx.Client, tokens, engine: Engine, clock: FakeClock, tmp_path: Path
):
    know_gpus(engine, clock, [GTX_1080_TI, TITAN_X])
    accounts = tmp_path / "slurm-accounts"
    accounts.write_text("# account team project\nproj0042 vision imagenet\nproj0043 nlp\n")
    env = base_env(tmp_path, server, tokens["agent"]) | {
        "GPUWARDEN_SLURM_ACCOUNTS": str(accounts),
        "SLURM_JOB_USER": "dave",
        "SLURM_JOB_GPUS": "0",
    }
    cases = [
        ("61", "proj0042", None, ("vision", "imagenet")),
        ("62", "proj0043", "project=llama", ("nlp", "llama")),
        ("63", "other", "team=infra;project=ci", ("infra", "ci")),
        ("64", "other", None, ("other", "")),
    ]
    for job_id, account, comment, want in cases:
        job_env = env | {"SLURM_JOB_ID": job_id, "SLURM_JOB_ACCOUNT": account}
        if comment is not None:
            job_env["SLURM_JOB_COMMENT"] = comment
        done = run_script("prolog.sh", job_env)
        assert done.returncode == 0 and done.stderr == "", done.stderr
        job = get_job(http, tokens, f"slurm:{job_id}")
        assert (job["team"], job["project"]) == want, job_id


def test_work_key_labels_name_account_work_and_script_hash(
    server: str, http: httpx.Client, tokens, engine: Engine, clock: FakeClock, tmp_path: Path
):
    know_gpus(engine, clock, [GTX_1080_TI, TITAN_X])
    bin_dir = tmp_path / "scontrol-bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    # As Slurm's: "write batch_script <id> -" prints the script, 72 has none (an salloc); "show
    # job -o" one line with the job's name (a Prolog is not given it).
    scontrol.write_text(
        '#!/bin/bash\ncase "$1 $2" in\n'
        '"show job") echo "JobId=$4 JobName=train UserId=dave(1) Comment=work=bert Priority=1";;\n'
        '"write batch_script") [ "$3" = 72 ] && exit 1\n'
        '  printf "#!/bin/bash\\npython train.py\\n";;\n*) exit 2;;\nesac\n'
    )
    scontrol.chmod(0o755)
    env = base_env(tmp_path, server, tokens["agent"]) | {
        "SLURM_JOB_USER": "dave",
        "SLURM_JOB_GPUS": "0",
        "SLURM_JOB_ACCOUNT": "proj7",
        "GPUWARDEN_SLURM_SCRIPT_HASH": "yes",
        "GPUWARDEN_SLURM_SCONTROL": "yes",
    }
    script_sha = hashlib.sha256(b"#!/bin/bash\npython train.py\n").hexdigest()
    done = run_script("prolog.sh", env | {"SLURM_JOB_ID": "71"},
                      path=f"{bin_dir}:{os.environ['PATH']}")  # fmt: skip
    assert done.returncode == 0 and done.stderr == "", done.stderr
    labels = get_job(http, tokens, "slurm:71")["labels"]
    assert labels == {
        "partition": "gpu", "cluster": "hpc1", "name": "train", "account": "proj7",
        "work": "bert", "script_sha256": script_sha,
    }  # fmt: skip
    done = run_script(
        "prolog.sh", env | {"SLURM_JOB_ID": "72"}, path=f"{bin_dir}:{os.environ['PATH']}"
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    labels = get_job(http, tokens, "slurm:72")["labels"]
    assert "script_sha256" not in labels and labels["name"] == "train"


def test_works_with_the_curl_of_rhel_8(
    server: str, http: httpx.Client, tokens, engine: Engine, clock: FakeClock, tmp_path: Path
):
    # curl 7.61 (RHEL 8) has no --fail-with-body (7.76); this curl refuses it as 7.61 does.
    know_gpus(engine, clock, [GTX_1080_TI, TITAN_X])
    old = tmp_path / "old-curl"
    old.mkdir()
    (old / "curl").write_text(
        "#!/bin/bash\n"
        'for a in "$@"; do case $a in --fail-with-body|--retry-all-errors)'
        ' echo "curl: option $a: is unknown" >&2; exit 2;; esac; done\n'
        f'exec {shutil.which("curl")} "$@"\n'
    )
    (old / "curl").chmod(0o755)
    env = base_env(tmp_path, server, tokens["agent"]) | {
        "SLURM_JOB_ID": "761",
        "SLURM_JOB_USER": "erin",
        "SLURM_JOB_GPUS": "0",
    }
    path = f"{old}:{os.environ['PATH']}"
    for name in ("prolog.sh", "epilog.sh"):
        done = run_script(name, env, path=path)
        assert done.returncode == 0 and done.stderr == "", done.stderr
    assert get_job(http, tokens, "slurm:761")["ended_at"] is not None


def test_a_refused_job_is_one_log_line(
    server: str, http: httpx.Client, tokens, engine: Engine, clock: FakeClock, tmp_path: Path
):
    # GPUs this node's token has never reported: the central refuses, the job still starts.
    env = base_env(tmp_path, server, tokens["agent"]) | {
        "SLURM_JOB_ID": "9",
        "SLURM_JOB_USER": "frank",
        "SLURM_JOB_GPUS": "0",
    }
    done = run_script("prolog.sh", env)
    assert done.returncode == 0
    (line,) = done.stderr.splitlines()
    assert line.startswith("gpuwarden-prolog: job slurm:9 not registered: HTTP 4"), line
    assert tokens["agent"] not in line


@pytest.fixture
def hung_central() -> Iterator[str]:
    """A TCP server that accepts connections and never answers; yields its URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        sock.close()


def test_a_hung_central_delays_a_job_by_a_few_seconds_at_most(hung_central: str, tmp_path: Path):
    env = base_env(tmp_path, hung_central, "gw_x") | {
        "SLURM_JOB_ID": "17",
        "SLURM_JOB_USER": "gina",
        "SLURM_JOB_GPUS": "0,1",
    }
    for name, what in (("prolog.sh", "not registered"), ("epilog.sh", "left to the agent")):
        # The central never answers: without the scripts' own budget (4 s) this would hang
        # until run_script's timeout (60 s) fails the test. How long it takes: bench/slurm.py.
        done = run_script(name, env)
        assert done.returncode == 0
        (line,) = done.stderr.splitlines()
        assert what in line and "HTTP 000" in line, line


def test_a_hung_nvidia_smi_is_cut_short(tmp_path: Path):
    env = base_env(tmp_path, "http://127.0.0.1:9", "gw_x") | {
        # Far past run_script's timeout (60 s): only the prolog's own limit ends it in time.
        "GPUWARDEN_NVIDIA_SMI": str(smi_stub(tmp_path / "bin", sleep=600)),
        "SLURM_JOB_ID": "18",
        "SLURM_JOB_GPUS": "0",
    }
    done = run_script("prolog.sh", env)
    assert done.returncode == 0
    (line,) = done.stderr.splitlines()
    assert "could not map GPUs 0 to UUIDs" in line, line


def test_each_node_of_a_multi_node_job_adds_and_ends_its_own_gpus(
    server: str, http: httpx.Client, tokens, engine: Engine, clock: FakeClock, tmp_path: Path
):
    know_gpus(engine, clock, [GTX_1080_TI, TITAN_X])
    b_uuids = ["GPU-b0", "GPU-b1"]
    know_gpus(engine, clock, b_uuids, hostname="node-b")
    node_b = tmp_path / "node-b"
    node_b.mkdir()
    csv_b = node_b / "smi.csv"
    csv_b.write_text(
        "".join(f"{i}, {u}, 00000000:{17 + i:02X}:00.0\n" for i, u in enumerate(b_uuids))
    )
    common = {"SLURM_JOB_ID": "77", "SLURM_JOB_USER": "alice", "SLURM_JOB_GPUS": "0,1"}
    env_a = base_env(tmp_path, server, tokens["agent"]) | common
    env_b = base_env(node_b, server, make_token(engine, "agent", "node-b")) | common
    env_b |= {
        "GPUWARDEN_NVIDIA_SMI": str(smi_stub(node_b / "bin", csv_b)),
        "GPUWARDEN_NVIDIA_PROC": str(node_b / "no-proc"),  # falls back to nvidia-smi's index
    }
    for env in (env_a, env_b):
        done = run_script("prolog.sh", env)
        assert done.returncode == 0 and done.stderr == "", done.stderr
    job = get_job(http, tokens, "slurm:77")
    assert sorted(g["gpu_uuid"] for g in job["gpus"]) == sorted([GTX_1080_TI, TITAN_X, *b_uuids])

    # Node a's epilog ends node a's part only; the job ends with its last node.
    assert run_script("epilog.sh", env_a).returncode == 0
    job = get_job(http, tokens, "slurm:77")
    assert job["ended_at"] is None
    assert {g["gpu_uuid"] for g in job["gpus"] if g["ended_at"] is None} == set(b_uuids)
    done = run_script("epilog.sh", env_b)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    job = get_job(http, tokens, "slurm:77")
    assert job["ended_at"] is not None
    assert all(g["ended_at"] is not None for g in job["gpus"])


def test_scripts_never_fail_the_job(tmp_path: Path):
    env = {
        "GPUWARDEN_ENV_FILE": str(tmp_path / "missing.env"),
        "GPUWARDEN_CENTRAL_URL": "http://127.0.0.1:9",  # nothing listens there
        "GPUWARDEN_AGENT_TOKEN": "gw_x",
        "GPUWARDEN_NVIDIA_SMI": "true",
        "GPUWARDEN_SLURM_TIMEOUT_SECONDS": "2.5",  # not whole seconds: the default is used
        "GPUWARDEN_JOB_END_DIR": str(tmp_path / "job-ends"),
        "SLURM_JOB_ID": "1",
        "SLURM_JOB_GPUS": "0",
    }
    for name in ("prolog.sh", "epilog.sh"):
        done = run_script(name, env)
        assert done.returncode == 0 and len(done.stderr.splitlines()) == 1, done.stderr
    # A job without GPUs on this node is none of GPU Warden's business: silent.
    quiet = {k: v for k, v in env.items() if k != "SLURM_JOB_GPUS"}
    for name in ("prolog.sh", "epilog.sh"):
        done = run_script(name, quiet)
        assert done.returncode == 0 and done.stderr == ""
