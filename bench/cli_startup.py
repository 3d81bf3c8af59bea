"""CPU seconds per ``gpuwarden`` command: ``--help`` and the HTTP commands against a served
central process, with a database command beside them for comparison.

Each command runs in a fresh interpreter, as a user's shell runs it, several times; the CPU time
(user + system, from the children's rusage) and the wall time are reported as medians. The
target is under 0.3 s of CPU for ``--help`` and the HTTP commands (``gpus``, ``job``, ``report
cost``), and under 0.5 s for the admin commands (``token list``, which opens the database, and
``policies check`` of the shipped example file). A fresh empty SQLite store: the figures are the
command's own start-up and one call.

With ``--gpus 1000`` the store holds that many GPUs (8 a node, a few minutes of samples, a job
on each pair of GPUs) and the big tables are timed too: ``gpus`` (a line per GPU) and ``report
cost --group-by gpu`` (a row per GPU); beside them, in this process, the layout of the same
``gpus`` rows by rich's table (what the CLI used before), by the CLI's table, and by plain
padding alone (the reference: every cell padded to its column's width, nothing more).

    flock /tmp/bench.lock .venv/bin/python -m bench.cli_startup
    flock /tmp/bench.lock .venv/bin/python -m bench.cli_startup --gpus 1000
"""

from __future__ import annotations

import argparse
import io
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import httpx

from bench.common import fresh_database, gpuwarden, machine, served
from bench.console import seed, wait_for_rollups

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


def best_ms(fn: Callable[[], object], runs: int) -> float:
    """The best of ``runs`` CPU times of ``fn()`` in this process, in ms."""
    times = []
    for _ in range(runs):
        t0 = time.process_time()
        fn()
        times.append((time.process_time() - t0) * 1000)
    return min(times)


def padded(rows: Sequence[Sequence[str]]) -> str:
    """The reference: every cell padded to its column's widest cell, one line a row."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(" ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def layouts(base: str, token: str, runs: int) -> None:
    """The ``gpus`` table's layout in this process: rich's table, the CLI's, plain padding."""
    from rich.console import Console
    from rich.table import Table

    from service.cli.fleet import FLEET_COLUMNS, fleet_rows
    from service.cli.tables import fit_table

    fleet = httpx.get(
        f"{base}/api/v1/fleet", headers={"Authorization": f"Bearer {token}"}, timeout=60
    ).json()
    rows = fleet_rows(fleet["gpus"])

    def printed(table: object) -> None:
        Console(file=io.StringIO(), width=200, color_system=None).print(table)

    def rich_table() -> None:
        table = Table(title="fleet")
        for c in FLEET_COLUMNS:
            table.add_column(c.name, justify=c.justify, no_wrap=True)
        for row in rows:
            table.add_row(*row)
        printed(table)

    cells = len(rows) * len(FLEET_COLUMNS)
    print(f"layout of the gpus table, {len(rows)} rows ({cells} cells), best CPU ms in-process:")
    print(f"  rich's table (before)           {best_ms(rich_table, runs):8.1f}")
    table_ms = best_ms(lambda: printed(fit_table(FLEET_COLUMNS, rows, width=200)[0]), runs)
    print(f"  the CLI's table, printed        {table_ms:8.1f}")
    print(f"  plain padding (reference)       {best_ms(lambda: padded(rows), runs):8.1f}")


def seeded(url: str, base: str, gpus: int) -> None:
    """``gpus`` GPUs (8 a node) with 5 minutes of samples, a job of two GPUs on each pair."""
    admin = gpuwarden(url, "token", "create", "--role", "admin").strip().splitlines()[-1]
    headers = {"Authorization": f"Bearer {admin}"}
    with httpx.Client(base_url=f"{base}/api/v1", headers=headers, timeout=120) as api:
        seed(api, datetime.now(UTC), random.Random(7), nodes=gpus // 8, minutes=5)
    wait_for_rollups(url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--gpus", type=int, default=0, help="GPUs in the store (default none)")
    args = parser.parse_args()
    print(f"machine: {machine()}; load: {os.getloadavg()[0]:.2f}")
    with fresh_database("sqlite") as url:
        gpuwarden(url, "migrate")
        token = gpuwarden(url, "token", "create", "--role", "reader").strip().splitlines()[-1]
        with served(url) as (base, _):
            if args.gpus:
                seeded(url, base, args.gpus)
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
            if args.gpus:
                by_gpu = ["report", "cost", "--since", "1h", "--group-by", "gpu"]
                commands += [
                    (["gpus", "--sort", "cost"], TARGET_CPU_SECONDS),
                    ([*by_gpu, "--limit", "1000"], TARGET_CPU_SECONDS),
                ]
            print(f"{'command':<52} {'CPU s (median)':>15} {'wall s':>8}  target")
            for argv, target in commands:
                runs = [timed(argv, env) for _ in range(args.runs)]
                cpu = statistics.median(c for c, _, _ in runs)
                wall = statistics.median(w for _, w, _ in runs)
                verdict = f"< {target} s " + ("met" if cpu < target else "MISSED")
                print(f"{' '.join(argv):<52} {cpu:>15.3f} {wall:>8.3f}  {verdict}")
            if args.gpus:
                layouts(base, token, args.runs)
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
