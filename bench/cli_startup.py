"""CPU seconds per ``gpuwarden`` command: ``--help`` and the HTTP commands against a served
central process, with a database command beside them for comparison.

Each command runs in a fresh interpreter, as a user's shell runs it, several times; the CPU time
(user + system, from the children's rusage) and the wall time are reported as medians. The
target is under 0.3 s of CPU for ``--help`` and the HTTP commands (``gpus``, ``job``, ``report
cost``), and under 0.5 s for the admin commands (``token list``, which opens the database, and
``policies check`` of the shipped example file). A fresh empty SQLite store: the figures are the
command's own start-up and one call.

    flock /tmp/bench.lock .venv/bin/python -m bench.cli_startup
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

from bench.common import fresh_database, gpuwarden, machine, served

TARGET_CPU_SECONDS = 0.3  # --help and the HTTP commands
ADMIN_TARGET_CPU_SECONDS = 0.5  # the database and config-file commands
EXAMPLE_CONFIG = "deploy/examples/gpuwarden.yaml"


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """CPU seconds (user + system) and wall seconds of one run of ``gpuwarden ARGV``; its rc."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-m", "service.cli", *argv], env=env, capture_output=True, timeout=120
    )
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, r.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    print(f"machine: {machine()}; load: {os.getloadavg()[0]:.2f}")
    with fresh_database("sqlite") as url:
        gpuwarden(url, "migrate")
        token = gpuwarden(url, "token", "create", "--role", "reader").strip().splitlines()[-1]
        with served(url) as (base, _):
            env = {
                **os.environ,
                "GPUWARDEN_DATABASE_URL": url,
                "GPUWARDEN_CENTRAL_URL": base,
                "GPUWARDEN_API_TOKEN": token,
                "COLUMNS": "120",
                # The example file's channels read these (README's walk exports them).
                "SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/T000/B000/XXXX",
                "GPUWARDEN_WEBHOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            }
            commands = [
                (["--help"], TARGET_CPU_SECONDS),
                (["gpus"], TARGET_CPU_SECONDS),
                (["job", "slurm:1"], TARGET_CPU_SECONDS),  # unknown: one call answered 404
                (["report", "cost", "--since", "1h"], TARGET_CPU_SECONDS),
                (["token", "list"], ADMIN_TARGET_CPU_SECONDS),
                (["policies", "check", EXAMPLE_CONFIG], ADMIN_TARGET_CPU_SECONDS),
            ]
            print(f"{'command':<44} {'CPU s (median)':>15} {'wall s':>8}  target")
            for argv, target in commands:
                runs = [timed(argv, env) for _ in range(args.runs)]
                cpu = statistics.median(c for c, _, _ in runs)
                wall = statistics.median(w for _, w, _ in runs)
                verdict = f"< {target} s " + ("met" if cpu < target else "MISSED")
                print(f"{' '.join(argv):<44} {cpu:>15.3f} {wall:>8.3f}  {verdict}")
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
