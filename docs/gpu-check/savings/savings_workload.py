"""One run of a wasteful or fixed workload for the savings check (issue 46), as its own process.

Run: python savings_workload.py RUN MODE AMOUNT OUT_JSON, RUN being ``<cause>:before`` (the
wasteful version) or ``<cause>:after`` (the same work with the fix applied), the workloads of
``../calibration/calib_workload.py``.

- MODE ``progress``: the run lasts AMOUNT seconds and reports its steps with GPU Warden's
  ``ProgressReporter`` (service/progress.py; the job id, central URL and token come from the
  environment as in a Slurm job). Its own timer leaves the first WARM seconds out and gives the
  seconds per step after them.
- MODE ``fixed``: the run does AMOUNT steps and exits, reporting no progress (a fixed-size job:
  its unit of work is the whole run). Its own timer gives the whole run's wall time, from the
  process's start (read from /proc, as time(1) would count it) to its end, and the loop's.

OUT_JSON gets the timing and the run's start and end (Unix time).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "calibration"))
sys.path.insert(0, str(HERE.parents[2]))

WARM = float(os.environ.get("WARM_SECONDS", "3"))


def process_start_unix() -> float:
    """When this process started (Unix time), from /proc: the run's wall time counts from it."""
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


def simulated_steps(run: str) -> Iterator[None]:
    """Steps that only sleep (10 ms fixed, 40 ms wasteful): the dry run without a GPU."""
    while True:
        time.sleep(0.01 if run.endswith(":after") else 0.04)
        yield


def main() -> None:
    run, mode, amount, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    born = process_start_unix()
    from service.progress import ProgressReporter

    if os.environ.get("BACKEND") == "simulated":  # no GPU: a dry run of the machinery
        steps = simulated_steps(run)
    else:
        import calib_workload
        import torch  # after the start time is read: its import is part of the run

        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
        steps = calib_workload.steps_of(run)
    start = time.time()
    result: dict[str, object] = {"run": run, "mode": mode, "process_start": born, "start": start}
    if mode == "fixed":
        done = 0
        for _ in steps:
            done += 1
            if done >= amount:
                break
        end = time.time()
        result.update(
            end=end, steps=done, loop_seconds=end - start, run_seconds=end - born,
            seconds_per_run=end - born,
        )  # fmt: skip
    else:
        reporter = ProgressReporter("steps", every_seconds=2.0)
        end_at, warm_at = start + amount, start + WARM
        counted, t_warm, t_last = 0, None, None
        for _ in steps:
            reporter.advance(1)
            now = time.time()
            if t_warm is not None:
                counted, t_last = counted + 1, now
            elif now >= warm_at:
                t_warm = now
            if now >= end_at:
                break
        reporter.close()  # the last total is sent before the process ends
        timed = (t_last - t_warm) if t_last is not None and t_warm is not None else 0.0
        result.update(
            end=time.time(), warm_seconds=WARM, timed_from=t_warm, timed_seconds=timed,
            steps=counted, steps_reported=reporter.total, reports_sent=reporter.sent_count,
            reporter_enabled=reporter.enabled,
            seconds_per_step=timed / counted if counted else None,
        )  # fmt: skip
    with open(out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(json.dumps(result), flush=True)
    os._exit(0)  # the DataLoader's persistent workers need no orderly shutdown


if __name__ == "__main__":
    main()
