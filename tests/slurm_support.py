"""Helpers for the Slurm tests: NVIDIA driver stand-ins built from captured output, known GPUs,
and a real one-node Slurm cluster (slurmctld, slurmd, munge) whose Prolog and Epilog are the
shipped scripts."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import BinaryIO

import httpx
import pytest
from sqlalchemy import Engine

from service.clock import utc_now
from tests.integration.cost_data import store_series
from tests.support import FakeClock, free_port

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "nvidia"
CAPTURED_CSV = DATA / "nvidia-smi-index-uuid-bus.csv"
CAPTURED_PROC = DATA / "proc-gpus"
# The two GPUs of the captured host, in nvidia-smi's index order (PCI order).
GTX_1080_TI = "GPU-e953c3c5-dba7-029e-ce44-7b51417131df"
TITAN_X = "GPU-4ce175fe-a313-4c4a-d620-560e96e8ef2e"
_TEMPLATE = (CAPTURED_PROC / "0000:17:00.0" / "information").read_text().splitlines()


def smi_stub(bin_dir: Path, csv: Path = CAPTURED_CSV, *, sleep: float = 0) -> Path:
    """A stand-in nvidia-smi in ``bin_dir`` printing ``csv`` for the prolog's one query."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    stub = bin_dir / "nvidia-smi"
    stub.write_text(
        "#!/bin/bash\n"
        f"sleep {sleep}\n"
        'case "$*" in *--query-gpu=index,uuid,pci.bus_id*--format=csv,noheader*) ;;'
        ' *) echo "unexpected arguments: $*" >&2; exit 2;; esac\n'
        f"cat {csv}\n"
    )
    stub.chmod(0o755)
    return stub


def fake_driver(out: Path, gpus: list[tuple[str, str, int]]) -> tuple[Path, Path]:
    """/proc/driver/nvidia/gpus and nvidia-smi CSV for ``gpus`` (uuid, bus, device minor).

    Each information file is the captured one with its UUID, bus and minor lines replaced;
    nvidia-smi numbers the GPUs in the order given (PCI order). Returns (proc dir, csv file).
    """
    proc = out / "proc-gpus"
    rows = []
    for index, (uuid, bus, minor) in enumerate(gpus):
        values = {"GPU UUID:": uuid, "Bus Location:": bus, "Device Minor:": str(minor)}
        lines = []
        for line in _TEMPLATE:
            key = next((k for k in values if line.startswith(k)), None)
            lines.append(f"{key} \t {values[key]}" if key else line)
        (proc / bus).mkdir(parents=True)
        (proc / bus / "information").write_text("\n".join(lines) + "\n")
        rows.append(f"{index}, {uuid}, 0000{bus.upper()}\n")
    csv = out / "nvidia-smi.csv"
    csv.write_text("".join(rows))
    return proc, csv


def know_gpus(engine: Engine, clock: FakeClock, uuids: list[str], hostname: str = "node-a") -> None:
    """The central has seen ``uuids`` on ``hostname``; its clock then follows the real one."""
    # The scripts date a job with the machine's clock; an agent token may only register a start
    # within the last hour, for GPUs its node has reported.
    clock.set(utc_now().replace(microsecond=0) - timedelta(minutes=5))
    for i, uuid in enumerate(uuids):
        store_series(
            engine, clock, uuid=uuid, index=i, start=clock(), metrics=[{"sm_active": 0.1}],
            hostname=hostname,
        )  # fmt: skip
    clock.advance(300)


NEEDED = (
    "slurmctld",
    "slurmd",
    "sbatch",
    "salloc",
    "scancel",
    "sinfo",
    "squeue",
    "munge",
    "unmunge",
)
# Device minors need not follow nvidia-smi's (PCI) order: here /dev/nvidia0 is index 2.
GPUS = [
    ("GPU-5e1a0000-0000-4000-8000-000000000000", "0000:17:00.0", 1),
    ("GPU-5e1a0001-0000-4000-8000-000000000001", "0000:31:00.0", 3),
    ("GPU-5e1a0002-0000-4000-8000-000000000002", "0000:4b:00.0", 0),
    ("GPU-5e1a0003-0000-4000-8000-000000000003", "0000:65:00.0", 2),
]
UUID_OF_MINOR = {minor: uuid for uuid, _, minor in GPUS}
# The Slurm node's name: the agent's host name (the agent token's node), as at a real site.
NODE = "node-a"


ACCOUNTING_NEEDED = ("slurmdbd", "sacct", "sacctmgr", "mariadbd", "mariadb-install-db")


def _missing(more: tuple[str, ...] = ()) -> str | None:
    absent = [b for b in NEEDED + more if shutil.which(b) is None]
    if absent:
        return (
            f"{', '.join(absent)} missing: run scripts/test-services.sh (Debian slurm-wlm,"
            " slurmdbd, mariadb-server, munge)"
        )
    if os.geteuid() != 0:
        return "the real Slurm test runs slurmd, which needs root (as CI runs)"
    return None


def _munge_ready() -> bool:
    cred = subprocess.run(["munge", "-n"], capture_output=True, timeout=10, check=False)
    if cred.returncode != 0:
        return False
    back = subprocess.run(["unmunge"], input=cred.stdout, capture_output=True, timeout=10)
    return back.returncode == 0


class Cluster:
    """A one-node Slurm cluster whose Prolog and Epilog are the shipped scripts; with
    ``accounting``, also a slurmdbd over its own MariaDB, so sacct reads the jobs."""

    def __init__(self, base: Path, *, accounting: bool = False) -> None:
        self.base = base
        self.accounting = accounting
        self.env = {**os.environ, "SLURM_CONF": str(base / "slurm.conf")}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.outputs: list[BinaryIO] = []

    def configure(self) -> None:
        b = self.base
        for d in ("state", "spool", "dev", "bin"):
            (b / d).mkdir()
        for i in range(len(GPUS)):
            os.mknod(b / "dev" / f"nvidia{i}", 0o600 | 0o020000, os.makedev(195, i))
        if self.accounting:
            self._configure_accounting()
        proc, csv = fake_driver(b, GPUS)
        smi_stub(b / "bin", csv)
        for name in ("prolog", "epilog"):
            wrapper = b / f"{name}-wrapper.sh"
            wrapper.write_text(
                "#!/bin/bash\n"
                f"export GPUWARDEN_ENV_FILE={b / 'agent.env'}\n"
                f"export PATH={b / 'bin'}\n"
                # Where sacctmgr and scontrol find the cluster (/etc/slurm at a site).
                f"export SLURM_CONF={b / 'slurm.conf'}\n"
                f"exec /bin/bash {ROOT / 'deploy' / 'slurm' / f'{name}.sh'}\n"
            )
            wrapper.chmod(0o755)
        self.proc_dir = proc
        host = socket.gethostname().split(".")[0]
        cpus = min(2, os.cpu_count() or 1)
        (b / "slurm.conf").write_text(
            f"""\
ClusterName=gwtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={b / "state"}
SlurmdSpoolDir={b / "spool"}
SlurmctldPidFile={b / "slurmctld.pid"}
SlurmdPidFile={b / "slurmd.pid"}
SlurmctldLogFile={b / "slurmctld.log"}
SlurmdLogFile={b / "slurmd.log"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
{self._accounting_lines()}
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
SchedulerParameters=sched_interval=1
GresTypes=gpu
Prolog={b / "prolog-wrapper.sh"}
Epilog={b / "epilog-wrapper.sh"}
PrologFlags=Alloc
NodeName={NODE} NodeAddr=127.0.0.1 CPUs={cpus} Gres=gpu:{len(GPUS)} State=UNKNOWN
PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        )
        (b / "gres.conf").write_text(
            f"NodeName={NODE} Name=gpu File={b / 'dev'}/nvidia[0-{len(GPUS) - 1}]\n"
        )

    def _configure_accounting(self) -> None:
        """A MariaDB on a free loopback port (its own data folder, no grants: only this test
        reaches it) and a slurmdbd.conf beside slurm.conf, where slurmdbd looks for it."""
        b = self.base
        self.db_port, self.dbd_port = free_port(), free_port()
        subprocess.run(
            ["mariadb-install-db", "--no-defaults", f"--datadir={b / 'db'}", "--user=root", "--auth-root-authentication-method=normal",
             "--skip-test-db"],
            capture_output=True, timeout=120, check=True,
        )  # fmt: skip
        conf = b / "slurmdbd.conf"
        conf.write_text(
            f"""\
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={self.dbd_port}
SlurmUser=root
PidFile={b / "slurmdbd.pid"}
LogFile={b / "slurmdbd.log"}
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={self.db_port}
StorageUser=root
StorageLoc=slurm_acct_db
"""
        )
        conf.chmod(0o600)  # slurmdbd refuses a configuration others can read

    def _accounting_lines(self) -> str:
        if not self.accounting:
            return "AccountingStorageType=accounting_storage/none"
        return (
            "AccountingStorageType=accounting_storage/slurmdbd\n"
            f"AccountingStorageHost=127.0.0.1\nAccountingStoragePort={self.dbd_port}"
        )

    def _start_accounting(self) -> None:
        """MariaDB, then slurmdbd, then the cluster's record in it (before slurmctld starts)."""
        b = self.base
        self._spawn(
            ["mariadbd", "--no-defaults", f"--datadir={b / 'db'}", "--user=root",
             "--bind-address=127.0.0.1", f"--port={self.db_port}", f"--socket={b / 'db.sock'}",
             "--skip-grant-tables", f"--pid-file={b / 'mariadbd.pid'}"],
        )  # fmt: skip
        self._until(lambda: _listening(self.db_port), "MariaDB")
        self._spawn(["slurmdbd", "-D"])
        self._until(lambda: _listening(self.dbd_port), "slurmdbd")
        self._until(self._cluster_recorded, "the cluster's record in slurmdbd")

    def _cluster_recorded(self) -> bool:
        self.run("sacctmgr", "-i", "add", "cluster", "gwtest", check=False)
        listed = self.run("sacctmgr", "-n", "-P", "list", "cluster", "format=cluster", check=False)
        return "gwtest" in listed.split()

    def _spawn(self, cmd: list[str]) -> None:
        log = (self.base / f"{Path(cmd[0]).name}.out").open("wb")
        self.outputs.append(log)
        self.procs.append(subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT))

    def _until(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 120  # a hang bound, as in start()
        while not ready():
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                raise AssertionError(f"{what} did not come up:\n{self.logs()}")
            time.sleep(0.3)

    def start(self) -> None:
        if self.accounting:
            self._start_accounting()
        for cmd in (["slurmctld", "-D", "-i"], ["slurmd", "-D", "-N", NODE]):
            log = (self.base / f"{cmd[0]}.out").open("wb")
            self.outputs.append(log)
            self.procs.append(
                subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT)
            )
        # A hang bound, not a timing: on a loaded machine slurmd registers late.
        deadline = time.monotonic() + 120
        while self.run("sinfo", "-h", "-N", "-o", "%T", check=False).strip() != "idle":
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                raise AssertionError(f"Slurm did not come up:\n{self.logs()}")
            time.sleep(0.3)

    def stop(self) -> None:
        self.run("scancel", "--full", "-u", "root", check=False)
        for proc in reversed(self.procs):
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        for log in self.outputs:
            log.close()

    def run(self, *cmd: str, check: bool = True) -> str:
        done = subprocess.run(
            cmd, env=self.env, capture_output=True, text=True, timeout=60, check=False
        )
        if check and done.returncode != 0:
            raise AssertionError(f"{cmd} failed: {done.stderr}\n{self.logs()}")
        return done.stdout

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.base.glob("*.log")) + sorted(self.base.glob("*.out"))
        )

    def point_at(self, url: str, token: str, job_ends: Path | None = None, **more: str) -> None:
        """The agent.env the wrapped scripts read: this central, this token, the /proc stand-in,
        the agent's job-end folder and ``more`` settings (``GPUWARDEN_...=value``)."""
        ends = job_ends or self.base / "job-ends"
        (self.base / "agent.env").write_text(
            f"GPUWARDEN_CENTRAL_URL={url}\nGPUWARDEN_AGENT_TOKEN={token}\n"
            f"GPUWARDEN_NVIDIA_PROC={self.proc_dir}\nGPUWARDEN_JOB_END_DIR={ends}\n"
            + "".join(f"{key}={value}\n" for key, value in more.items())
        )

    def wait_gone(self, slurm_id: str) -> None:
        """Until Slurm has finished job ``slurm_id`` (its epilog included)."""
        deadline = time.monotonic() + 60
        while self.run("squeue", "-h", "-j", slurm_id, "-o", "%T", check=False).strip():
            assert time.monotonic() < deadline, f"job {slurm_id} still queued\n{self.logs()}"
            time.sleep(0.3)
        while self.run("sinfo", "-h", "-N", "-o", "%T", check=False).strip() != "idle":
            assert time.monotonic() < deadline, f"node not idle again\n{self.logs()}"
            time.sleep(0.3)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def slurm_cluster(
    tmp_path_factory: pytest.TempPathFactory, *, accounting: bool = False
) -> Iterator[Cluster]:
    """A started one-node cluster for a test module's fixture (with ``accounting``, slurmdbd
    too); skipped (failed under CI) where Slurm, munge or root is missing."""
    why = _missing(ACCOUNTING_NEEDED if accounting else ())
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    assert _munge_ready(), "munged is not running: run scripts/test-services.sh"
    c = Cluster(tmp_path_factory.mktemp("slurm"), accounting=accounting)
    c.configure()
    try:
        # Inside the try: a cluster that fails to come up still has its daemons stopped and
        # their log files closed (a file left open fails a later test as unraisable).
        c.start()
        yield c
    finally:
        c.stop()


def squeue_stand_in(
    path: Path, job: str, *, user: str, started_at: datetime, node: str = NODE,
    gone_when: Path | None = None,
) -> Path:  # fmt: skip
    """A stand-in squeue at ``path`` listing Slurm job ``job`` running for ``user`` on ``node``
    since ``started_at``, as the driver asks for it (until ``gone_when`` exists)."""
    line = f"{job}:{job}:{user}:RUNNING:(null):{int(started_at.timestamp())}:{node}"
    gate = f"[ -e {gone_when} ] || " if gone_when is not None else ""
    path.write_text(f"#!/bin/sh\n{gate}echo '{line}'\n")
    path.chmod(0o755)
    return path


def wait_for_job(http: httpx.Client, reader: str, job_id: str, *, ended: bool) -> dict:  # type: ignore[type-arg]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        r = http.get(f"/api/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {reader}"})
        if r.status_code == 200 and (r.json()["ended_at"] is not None) == ended:
            return r.json()  # type: ignore[no-any-return]
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} not {'ended' if ended else 'registered'}: {r.text}")
