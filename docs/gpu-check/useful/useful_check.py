"""Real-GPU check of useful work (issue 47): the real agent (NVML + GPM + /proc, 1 s) ships to a
real central (SQLite) through a recording proxy while each workload of useful_workload.py runs
as its own process; then the detector (service/core/useful_work.py) is replayed over the
recorded batches, a window ending at every sample, and the share of each phase's GPU-seconds
after the hold that is sham or hung is reported (``useful_result.json``).

Run on the device machine from the repository root (docs/gpu-check/useful/README.md):

    HOLD_SECONDS=20 WASTE_SECONDS=60 REAL_SECONDS=42 python3 docs/gpu-check/useful/useful_check.py OUT
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE.parent))

from causes_check import cli, free_port, nvidia_smi_cards, start_agent, wait_healthy  # noqa: E402

from service.core.useful_work import Rules  # noqa: E402
from service.core.useful_work_replay import phase_shares, recorded_points  # noqa: E402

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu-check-out")
HOLD = float(os.environ.get("HOLD_SECONDS", "20"))
WASTE_S = float(os.environ.get("WASTE_SECONDS", "60"))
REAL_S = float(os.environ.get("REAL_SECONDS", "42"))
BACKEND = os.environ.get("BACKEND", "nvml")
WASTE = ("pid_matmul", "relu_bursts", "spin_sleep", "hung_flag")
REAL = ("starved_training", "inference_light", "checkpoint_write", "eval_loop", "notebook_cell")
PHASES = os.environ.get("PHASES", ",".join(WASTE + REAL)).split(",")
TMP = Path("/tmp/gwu")
DRY = """import json, sys, time
from pathlib import Path
out = Path(sys.argv[1])
for arg in sys.argv[2:]:
    name, seconds = arg.split(":")
    ph = json.loads(out.read_text()) if out.exists() else []
    ph.append({"phase": name, "want": "dry", "start": time.time(), "pid": 0})
    time.sleep(float(seconds))
    ph[-1]["end"] = time.time()
    out.write_text(json.dumps(ph))
"""


def central_verdicts(db: Path, phases: list[dict[str, object]]) -> dict[str, object]:
    """The central's own verdict job (service/usecases/useful_work.py) run every 5 s of the
    recorded time over the stored data, as its scheduler would; then, per phase, the share of
    the stored samples' seconds after the hold whose cause is sham or hung."""
    import sqlite3
    from datetime import UTC, datetime

    from service.core.diagnosis import Cause
    from service.db.engine import make_engine
    from service.settings import Settings
    from service.usecases.useful_work import judge_once

    engine = make_engine(f"sqlite:///{db}")
    settings = Settings(database_url=f"sqlite:///{db}", useful_work_hold_minutes=HOLD / 60)
    con = sqlite3.connect(db)
    lo, hi = con.execute("SELECT MIN(ts), MAX(ts) FROM samples").fetchone()
    t = datetime.fromisoformat(lo).replace(tzinfo=UTC).timestamp() + HOLD
    end = datetime.fromisoformat(hi).replace(tzinfo=UTC).timestamp()
    kinds: dict[str, int] = {}
    # One run after the last sample too: the scheduler keeps running, and a run at t sees only
    # the samples taken up to t (stopping at the last sample left its last seconds unjudged).
    while t < end + 5.0:
        for j in judge_once(engine, settings, now=datetime.fromtimestamp(t, UTC)):
            kinds[j.verdict.kind.value] = kinds.get(j.verdict.kind.value, 0) + 1
        t += 5.0
    rows = [
        (datetime.fromisoformat(ts).replace(tzinfo=UTC).timestamp(), cause)
        for ts, cause in con.execute("SELECT ts, cause FROM samples ORDER BY ts")
    ]
    jobs = con.execute("SELECT job_id, COUNT(*) FROM job_gpus GROUP BY job_id").fetchall()
    con.close()
    useless = {int(Cause.SHAM), int(Cause.HUNG)}
    table = []
    for ph in phases:
        a, b = float(ph["start"]) + HOLD, float(ph["end"]) - 0.5  # type: ignore[arg-type]
        inside = [c for ts, c in rows if a <= ts <= b]
        n = sum(1 for c in inside if c in useless)
        table.append({"phase": ph["phase"], "samples": len(inside),
                      "sham_or_hung_share": round(n / len(inside), 4) if inside else None})  # fmt: skip
    return {"judged": kinds, "jobs": jobs, "table": table}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    TMP.mkdir(parents=True, exist_ok=True)
    db = TMP / "gw.db"
    db.unlink(missing_ok=True)
    port = free_port()
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        GPUWARDEN_DATABASE_URL=f"sqlite:///{db}",
        GPUWARDEN_PORT=str(port),
    )
    cli("migrate", env=env)
    agent_token = cli("token", "create", "--role", "agent", "--node", "useful-check", env=env)
    central = subprocess.Popen([sys.executable, "-m", "service.cli", "serve"], env=env)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url)
    record = OUT / "useful_agent_output.jsonl"
    proxy, agent = start_agent(
        url, record, token=agent_token, node="useful-check", backend=BACKEND, batch_seconds=5,
        tmp=TMP, env=env,
    )  # fmt: skip
    time.sleep(3)
    phases_file = OUT / "useful_phases.json"
    phases_file.unlink(missing_ok=True)
    # One job runs the keep-alive loops and the real work in turn; the hung kernel is a job of
    # its own, killed when its phase ends (it never returns).
    runs = [[p for p in PHASES if p != "hung_flag"], [p for p in PHASES if p == "hung_flag"]]
    for k, names in enumerate(r for r in runs if r):
        args = [f"{n}:{WASTE_S if n in WASTE else REAL_S}" for n in names]
        total = sum(WASTE_S if n in WASTE else REAL_S for n in names)
        wl_env = dict(env, SLURM_JOB_ID=str(800 + k), SLURM_JOB_USER="alice")
        if BACKEND == "nvml":
            cmd = [sys.executable, str(HERE / "useful_workload.py"), str(phases_file), *args]
        else:  # a dry run without a GPU: the phases' times only
            cmd = [sys.executable, "-c", DRY, str(phases_file), *args]
        proc = subprocess.Popen(cmd, env=wl_env)
        try:
            proc.wait(total + 60)
        except subprocess.TimeoutExpired:
            pass
        if proc.poll() is None:  # the hung kernel: its phase ends when it is killed
            start = json.loads(phases_file.read_text())[-1]["start"]
            time.sleep(max(0.0, start + WASTE_S - time.time()))
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            phases = json.loads(phases_file.read_text())
            phases[-1]["end"] = time.time()
            phases_file.write_text(json.dumps(phases, indent=1))
    time.sleep(2)
    agent.send_signal(signal.SIGTERM)
    agent.wait(30)
    central.send_signal(signal.SIGTERM)
    central.wait(30)
    proxy.shutdown()
    phases = json.loads(phases_file.read_text())
    gpus = recorded_points(record.read_text())
    rules = Rules(hold_seconds=HOLD)
    table = phase_shares(gpus, phases, rules)
    try:
        stored = central_verdicts(db, phases)
    except Exception as exc:  # the replay above still stands
        stored = {"error": repr(exc)}
    result = {
        "central": stored,
        "hold_seconds": HOLD,
        "waste_seconds": WASTE_S,
        "real_seconds": REAL_S,
        "nvidia_smi_L": nvidia_smi_cards(),
        "phases": phases,
        "table": table,
    }
    (OUT / "useful_result.json").write_text(json.dumps(result, indent=1, default=str))
    for t in table:
        print(json.dumps(t, default=str))
    print(json.dumps(stored, default=str))


if __name__ == "__main__":
    main()
