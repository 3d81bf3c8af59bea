"""The whole service under a simulated fleet: ingest, rollups, evaluation, /metrics and pages.

One `gpuwarden serve` (default settings: scheduler, default policies) on a fresh PostgreSQL
database; --gpus GPUs as nodes of 8, each node a SimulatedBackend whose polls (every --poll
seconds) are built and joined into one gzip batch every --batch seconds with the agent's own
batch code (service.collectors.batch), posted with the agent's X-Request-Timeout. The nodes run
in --senders processes (asyncio, staggered over the batch interval). Meanwhile the main process
looks every --look seconds: GET /metrics (whole and shard 0 of 4: time and size), the fleet and
jobs pages' API reads, the rollup backlog (rows of rollup_dirty) and the newest sample's age.

Prints, with the machine and its load: accepted / offered batches and their latency, ingest lag
(the age of the stalest GPU's newest stored sample, which one batch interval bounds when ingest
keeps up), the rollup backlog, each background round's mean and worst time per run (from the
service's histograms; skipped runs: a round still running when the next was due), /metrics and
page times, and the central process's CPU. Usage (the machine is shared: take the bench lock):

    flock /tmp/bench.lock .venv/bin/python -m bench.scale --gpus 1000 --seconds 600

--serves N runs N central processes on the database (the nodes spread over them by number, as
a load balancer would) with the rollup in --rollup-shards shards; each process's background
rounds are printed apart.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import time
from collections import Counter
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select

from bench.common import fresh_database, gpuwarden, machine, percentile, served
from bench.console import PAGES, cpu_ms
from service.clock import utc_now
from service.collectors.batch import build_batch, gzip_body, join_polls, poll_json
from service.collectors.simulated import SimulatedBackend
from service.core.buckets import floor_day
from service.db import tokens_repo
from service.db.engine import make_engine
from service.db.schema import cost_gpu_1d, rollup_dirty

GPUS_PER_NODE = 8
AGENT_TIMEOUT_SECONDS = 30.0  # the agent's HTTP timeout, announced as X-Request-Timeout


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def _tokens(url: str, nodes: list[str]) -> tuple[list[str], str]:
    """An agent token per node and one reader token, made in the database directly."""
    engine = make_engine(url)
    now = utc_now()
    try:
        with engine.begin() as conn:
            agents = [
                tokens_repo.create_token(
                    conn, role=tokens_repo.Role.AGENT, node=n, name=None, now=now
                )[0]
                for n in nodes
            ]
            reader, _ = tokens_repo.create_token(
                conn, role=tokens_repo.Role.READER, node=None, name=None, now=now
            )
    finally:
        engine.dispose()
    return agents, reader


def senders_process(
    bases: list[str], nodes: list[tuple[str, str]], args: argparse.Namespace, out: Any
) -> None:
    """Each node polls its simulated GPUs and ships a batch every args.batch seconds to one of
    ``bases`` (node number modulo their count, as a load balancer would spread them); puts
    [(status, seconds)] per request on ``out``."""

    async def node(
        clients: list[httpx.AsyncClient], k: int, hostname: str, token: str
    ) -> list[Any]:
        # Job ids of their own per node (the backend's ids repeat across nodes otherwise, and
        # one job claimed by two nodes' users is a refused ownership conflict, not a load).
        number = int(hostname.rsplit("-", 1)[1])  # the node's number over every sender
        backend = SimulatedBackend(
            hostname=hostname,
            gpus=GPUS_PER_NODE,
            seed=number,
            start=utc_now(),
            job_base=10_000 * (number + 1),
        )
        client = clients[number % len(clients)]
        headers = {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Content-Encoding": "gzip",
            "X-Request-Timeout": f"{AGENT_TIMEOUT_SECONDS:g}",
        }
        polls_per_batch = max(1, round(args.batch / args.poll))
        results: list[tuple[int, float]] = []
        polls: list[bytes] = []
        start = time.monotonic()
        await asyncio.sleep(args.batch * k / len(nodes))  # spread over the batch interval
        due = time.monotonic()
        while time.monotonic() - start < args.seconds:
            snap = backend.sample(datetime.now(UTC))
            polls.append(
                poll_json(
                    build_batch(
                        hostname=hostname,
                        labels={},
                        devices=backend.devices(),
                        snapshots=[snap],
                    )
                )
            )
            if len(polls) >= polls_per_batch:
                body = gzip_body(join_polls(polls))
                polls = []
                t0 = time.perf_counter()
                try:
                    r = await client.post("/api/v1/ingest", content=body, headers=headers)
                    results.append((r.status_code, time.perf_counter() - t0))
                except httpx.HTTPError:
                    results.append((-1, time.perf_counter() - t0))
            due += args.poll  # on the poll schedule, however long the post took
            await asyncio.sleep(max(0.0, due - time.monotonic()))
        return results

    async def main() -> list[Any]:
        limits = httpx.Limits(max_connections=len(nodes) + 4)
        clients = [
            httpx.AsyncClient(base_url=base, timeout=AGENT_TIMEOUT_SECONDS, limits=limits)
            for base in bases
        ]
        try:
            per = await asyncio.gather(*(node(clients, k, h, t) for k, (h, t) in enumerate(nodes)))
        finally:
            for client in clients:
                await client.aclose()
        return [x for xs in per for x in xs]

    out.put(asyncio.run(main()))


def _timed_get(
    client: httpx.Client, path: str, params: dict[str, str] | None
) -> tuple[float, int, float]:
    """(wall seconds, bytes, the server's own seconds from its Server-Timing header)."""
    t0 = time.perf_counter()
    r = client.get(path, params=params)
    r.raise_for_status()
    wall = time.perf_counter() - t0
    timing = r.headers.get("server-timing", "")
    server = float(timing.split("dur=")[1]) / 1000 if "dur=" in timing else float("nan")
    return wall, len(r.content), server


def _families(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def look(
    client: httpx.Client, url: str, seen: dict[str, list[float]], metrics_shards: int = 4
) -> None:
    """One round of observations, appended to ``seen``: /metrics whole and its first shard of
    ``metrics_shards``, the pages, the lag and the rollup backlog."""
    seconds, size, _ = _timed_get(client, "/metrics", None)
    seen["metrics_s"].append(seconds)
    seen["metrics_mb"].append(size / 1e6)
    seconds, size, _ = _timed_get(client, "/metrics", {"shard": f"0/{metrics_shards}"})
    seen["shard_s"].append(seconds)
    seen["shard_mb"].append(size / 1e6)
    for page in ("fleet", "jobs"):
        total = server = 0.0
        for path, params in PAGES[page]:
            if path.startswith("/api/v1/") and path != "/api/v1/session":
                wall, _, own = _timed_get(client, path, params)
                total, server = total + wall, server + own
        seen[f"{page}_s"].append(total)
        seen[f"{page}_server_s"].append(server)
    ages = [
        v
        for (name, _), v in _families(client.get("/metrics").text).items()
        if name == "gpuwarden_gpu_sample_age_seconds"
    ]
    if ages:
        seen["lag_s"].append(max(ages))
    seen["gpus_exported"].append(len(ages))
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            backlog = conn.execute(select(func.count()).select_from(rollup_dirty)).scalar_one()
            summed = conn.execute(
                select(func.count())
                .select_from(cost_gpu_1d)
                .where(cost_gpu_1d.c.day == floor_day(utc_now()))
            ).scalar_one()
    finally:
        engine.dispose()
    seen["backlog_rows"].append(float(backlog))
    seen["today_summed"].append(float(summed))


def rounds(text: str) -> list[str]:
    """Per background task: runs, mean seconds, the bucket its worst run fell in, ticks skipped
    (the last run still busy) and ticks left to another process (its turn or leadership)."""
    fams = _families(text)
    lines = []
    tasks = sorted(
        {
            dict(k[1])["task"]
            for k in fams
            if k[0] == "gpuwarden_background_job_duration_seconds_count"
        }
    )
    for task in tasks:
        key = (("task", task),)
        count = fams.get(("gpuwarden_background_job_duration_seconds_count", key), 0.0)
        total = fams.get(("gpuwarden_background_job_duration_seconds_sum", key), 0.0)
        buckets = sorted(
            (float(dict(k[1])["le"]), v)
            for k, v in fams.items()
            if k[0] == "gpuwarden_background_job_duration_seconds_bucket"
            and dict(k[1])["task"] == task
        )
        worst = next((le for le, v in buckets if v >= count), float("inf"))
        runs = {
            outcome: fams.get(
                ("gpuwarden_background_job_runs_total", (("outcome", outcome), ("task", task))), 0.0
            )
            for outcome in ("skipped", "elsewhere")
        }
        if count or runs["elsewhere"]:
            timed = f"mean {total / count:.2f} s, worst <= {worst:g} s" if count else "none timed"
            lines.append(
                f"  {task}: {count:.0f} runs, {timed}, "
                f"{runs['skipped']:.0f} skipped (still busy), {runs['elsewhere']:.0f} elsewhere "
                "(another process's turn)"
            )
    return lines


def postgres_cpu_ms() -> float:
    """CPU time (ms) of this machine's PostgreSQL processes alive now (the server's own and its
    backends; a backend that exited meanwhile is missed, the pools keep theirs open)."""
    total = 0.0
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() == "postgres":
                total += cpu_ms(int(comm.parent.name))
        except (OSError, ValueError):
            continue  # gone meanwhile
    return total


def run(args: argparse.Namespace) -> None:
    n_nodes = args.gpus // GPUS_PER_NODE
    hostnames = [f"sim-{k:05d}" for k in range(n_nodes)]
    with fresh_database("postgresql") as url:
        gpuwarden(url, "migrate")
        agents, reader = _tokens(url, hostnames)
        with ExitStack() as stack:
            shards = str(args.rollup_shards)
            servers = [
                stack.enter_context(served(url, GPUWARDEN_ROLLUP_SHARDS=shards))
                for _ in range(args.serves)
            ]
            bases = [base for base, _ in servers]
            base = bases[0]
            cpu0, wall0 = sum(cpu_ms(p.pid) for _, p in servers), time.monotonic()
            pg0 = postgres_cpu_ms()
            load_before = _load()
            ctx = mp.get_context("spawn")
            queue = ctx.Queue()
            nodes = list(zip(hostnames, agents, strict=True))
            parts = [nodes[i :: args.senders] for i in range(args.senders)]
            procs = [
                ctx.Process(target=senders_process, args=(bases, part, args, queue))
                for part in parts
            ]
            for p in procs:
                p.start()
            seen: dict[str, list[float]] = {
                k: []
                for k in (
                    "metrics_s", "metrics_mb", "shard_s", "shard_mb", "fleet_s", "jobs_s",
                    "fleet_server_s", "jobs_server_s", "lag_s", "gpus_exported", "backlog_rows",
                    "today_summed",
                )
            }  # fmt: skip
            headers = {"Authorization": f"Bearer {reader}"}
            with httpx.Client(base_url=base, headers=headers, timeout=120) as client:
                time.sleep(min(args.seconds / 3, 2 * args.batch))  # past the first batches
                while time.monotonic() - wall0 < args.seconds:
                    look(client, url, seen, args.metrics_shards)
                    time.sleep(args.look)
                shipped = [x for _ in procs for x in queue.get(timeout=args.seconds + 300)]
                senders_ms = sum(cpu_ms(p.pid) for p in procs if p.pid is not None)
                elapsed = time.monotonic() - wall0
                shares = {
                    "central": (sum(cpu_ms(p.pid) for _, p in servers) - cpu0) / 1000 / elapsed,
                    "PostgreSQL": (postgres_cpu_ms() - pg0) / 1000 / elapsed,
                    "senders (the simulated fleet)": senders_ms / 1000 / elapsed,
                }
                for p in procs:
                    p.join(30)
                finals = [httpx.get(f"{b}/metrics", headers=headers, timeout=120).text
                          for b in bases]  # fmt: skip
            load_after = _load()
            sizes = row_bytes(url)
    report(args, n_nodes, shipped, seen, finals, shares, load_before, load_after)
    print(f"stored bytes per row, indexes included: {sizes}")


def row_bytes(url: str) -> str:
    """Bytes per row of the raw samples (all partitions) and of rollup_1m, indexes included."""
    engine = make_engine(url)
    out = []
    try:
        with engine.connect() as conn:
            for table in ("samples", "rollup_1m"):
                # A partitioned table's size is its partitions'; a plain table's its own.
                size = conn.exec_driver_sql(
                    "SELECT GREATEST(pg_total_relation_size(%(t)s::regclass), (SELECT COALESCE("
                    "SUM(pg_total_relation_size(relid)), 0) FROM pg_partition_tree(%(t)s::regclass)))",
                    {"t": table},
                ).scalar_one()
                rows = conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar_one()
                out.append(f"{table} {size / max(1, rows):.0f} ({rows} rows)")
    finally:
        engine.dispose()
    return ", ".join(out)


def _range(values: list[float], unit: str, digits: int = 2) -> str:
    if not values:
        return "n/a"
    return (
        f"median {statistics.median(values):.{digits}f} {unit}, "
        f"max {max(values):.{digits}f} {unit} ({len(values)} looks)"
    )


def report(
    args: argparse.Namespace,
    n_nodes: int,
    shipped: list[tuple[int, float]],
    seen: dict[str, list[float]],
    finals: list[str],
    shares: dict[str, float],
    load_before: str,
    load_after: str,
) -> None:
    statuses = Counter(s for s, _ in shipped)
    ok = [t for s, t in shipped if s == 200]
    offered = len(shipped)
    print(f"machine: {machine()}; PostgreSQL; {load_before} before, {load_after} after")
    print(
        f"fleet: {args.gpus} GPUs = {n_nodes} nodes x {GPUS_PER_NODE}, poll {args.poll:g} s, "
        f"one batch per node every {args.batch:g} s, {args.senders} sender processes, "
        f"{args.seconds:g} s; {args.serves} central process(es), rollup in "
        f"{args.rollup_shards} shard(s)"
    )
    print(
        f"accepted / offered: {len(ok)} / {offered} = {100 * len(ok) / max(1, offered):.1f}% "
        f"(answers {dict(sorted(statuses.items()))})"
    )
    if ok:
        print(
            f"ingest latency (client): p50 {percentile(ok, 50):.3f} s, p99 {percentile(ok, 99):.3f} s"
        )
    print(f"ingest lag (stalest GPU's newest sample): {_range(seen['lag_s'], 's', 1)}")
    print(f"GPUs exported on /metrics: {_range(seen['gpus_exported'], 'GPUs', 0)}")
    print(f"rollup backlog (rollup_dirty rows): {_range(seen['backlog_rows'], 'rows', 0)}")
    for i, final in enumerate(finals):
        print(f"background rounds (server histograms, central process {i}):")
        for line in rounds(final):
            print(line)
    print(
        f"GET /metrics: {_range(seen['metrics_s'], 's')}; size {_range(seen['metrics_mb'], 'MB')}"
    )
    print(
        f"GET /metrics?shard=0/{args.metrics_shards}: {_range(seen['shard_s'], 's')}; size {_range(seen['shard_mb'], 'MB')}"
    )
    for page in ("fleet", "jobs"):
        print(
            f"{page} page API reads: wall {_range(seen[f'{page}_s'], 's', 3)}; server "
            f"{_range(seen[f'{page}_server_s'], 's', 3)}"
        )
    # A young fleet has no sums of today for its first minutes (cost_today_settle_seconds of
    # history first): those looks read today from the minute rollups, the later ones from sums.
    for page in ("fleet", "jobs"):
        looks = list(zip(seen["today_summed"], seen[f"{page}_s"], strict=True))
        before = [s for summed, s in looks if not summed]
        after = [s for summed, s in looks if summed]
        print(
            f"{page} page API reads before today's sums existed: {_range(before, 's', 3)}; "
            f"after: {_range(after, 's', 3)}"
        )
    print(
        "CPU, in cores: "
        + ", ".join(f"{who} {share:.2f}" for who, share in shares.items())
        + " (central: all its processes; PostgreSQL: where it runs on this machine)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--poll", type=float, default=10.0, help="poll interval (s)")
    parser.add_argument("--batch", type=float, default=30.0, help="batch interval (s)")
    parser.add_argument("--senders", type=int, default=2, help="sender processes")
    parser.add_argument("--look", type=float, default=15.0, help="seconds between looks")
    parser.add_argument("--serves", type=int, default=1, help="central processes")
    parser.add_argument("--rollup-shards", type=int, default=1, help="GPUWARDEN_ROLLUP_SHARDS")
    parser.add_argument("--metrics-shards", type=int, default=4, help="n of /metrics?shard=0/n")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
