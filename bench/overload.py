"""Agents keep shipping while 200 readers and a bad-token flood hit the central service.

One `gpuwarden serve` (one uvicorn worker, default settings) on loopback, seeded with 30 minutes
of history and some jobs. Then, for --seconds: --agents agents each post one gzip batch every
--batch-seconds (the agent's normal rate: 3 polls x 4 GPUs per batch), in their own process so
their timings are not skewed by the flood's client; in a second process --readers closed-loop
readers cycle through the read routes (GPU list, alerts, 1 h and 7 d series, job list, cost
report) and --flooders closed-loop clients send bad tokens (half fresh random ones, half one
fixed token). The seed's rollups finish first (the steady state). Prints the agents' errors and ingest p50/p99 beside the readers' and the flood's
outcomes. Target: agents 0 errors and ingest p99 < 1 s; readers answered (200, or 503/429) within
1 s, never a 500 or a hang (client timeout 10 s). Usage:
python -m bench.overload [--db sqlite|postgresql|both] [--seconds 30]

--replay N instead floods ingest the way agents replaying their spools after an outage do: N
senders at once, each one batch of --replay-polls polls x 4 GPUs, announcing X-Request-Timeout
30 s and sending again after Retry-After until stored; prints the answers, the slowest single
answer beside the 30 s timeout, and the time until every sample was stored (each exactly once).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import multiprocessing as mp
import random
import secrets
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from bench.common import fresh_database, gpuwarden, machine, percentile, served

GPUS_PER_NODE = 4
POLLS_PER_BATCH = 3
POLL_SECONDS = 10.0
HANG_SECONDS = 10.0  # a reader answer slower than this counts as a hang
READ_DEADLINE_SECONDS = 1.0


def _metrics(rng: random.Random) -> dict[str, float | int]:
    return {
        "sm_active": rng.random(),
        "sm_occupancy": rng.random(),
        "tensor_active": rng.random(),
        "dram_active": rng.random(),
        "gr_engine_active": rng.random(),
        "fb_used_bytes": rng.randrange(0, 80 * 2**30),
        "power_watts": rng.uniform(60, 700),
        "temperature_celsius": rng.uniform(30, 85),
    }


def batch(node: int, stamps: list[datetime], rng: random.Random) -> bytes:
    """One agent's gzip body: ``stamps`` polls of its GPUS_PER_NODE GPUs."""
    uuids = [f"GPU-{node:03d}-{g}" for g in range(GPUS_PER_NODE)]
    body = {
        "node": {"hostname": f"node-{node:03d}", "labels": {"rack": f"r{node % 8}"}},
        "gpus": [
            {"uuid": u, "index": i, "model": "NVIDIA H100 80GB HBM3", "fb_total_bytes": 80 * 2**30}
            for i, u in enumerate(uuids)
        ],
        "samples": [
            {"gpu_uuid": u, "ts": ts.isoformat(), "metrics": _metrics(rng)}
            for ts in stamps
            for u in uuids
        ],
    }
    return gzip.compress(json.dumps(body).encode(), 1)


def _headers(token: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/json",
        "Content-Encoding": "gzip",
    }


def seed(base: str, tokens: list[str], admin: str, minutes: int) -> None:
    """``minutes`` of history for every node (30 s apart), a price and a job per node."""
    rng = random.Random(1)
    now = datetime.now(UTC).replace(microsecond=0)
    stamps = [now - timedelta(seconds=30 * k) for k in range(minutes * 2, 0, -1)]
    with httpx.Client(base_url=base, timeout=60) as c:
        for node, token in enumerate(tokens):
            r = c.post("/api/v1/ingest", content=batch(node, stamps, rng), headers=_headers(token))
            r.raise_for_status()
        admin_h = {"Authorization": f"Bearer {admin}"}
        price = {
            "model_pattern": "*H100*",
            "usd_per_gpu_hour": 4.0,
            "effective_from": "2020-01-01T00:00:00Z",
        }
        c.put("/api/v1/prices", json=[price], headers=admin_h).raise_for_status()
        for node in range(len(tokens)):
            job = {
                "id": f"slurm:{1000 + node}",
                "user": f"user{node % 7}",
                "team": f"team{node % 3}",
                "gpus": [f"GPU-{node:03d}-{g}" for g in range(GPUS_PER_NODE)],
                "started_at": stamps[0].isoformat(),
            }
            c.post("/api/v1/jobs", json=job, headers=admin_h).raise_for_status()


def agents_process(
    base: str, tokens: list[str], batch_seconds: float, seconds: float, out: Any
) -> None:
    """Each agent posts one batch every ``batch_seconds``, staggered; results to ``out``."""

    async def agent(client: httpx.AsyncClient, node: int, token: str) -> list[tuple[int, float]]:
        rng = random.Random(node)
        results: list[tuple[int, float]] = []
        start = time.monotonic()
        await asyncio.sleep(batch_seconds * node / len(tokens))
        while time.monotonic() - start < seconds:
            now = datetime.now(UTC)
            stamps = [
                now - timedelta(seconds=POLL_SECONDS * k, microseconds=node)
                for k in range(POLLS_PER_BATCH)
            ]
            body = batch(node, stamps, rng)
            t0 = time.perf_counter()
            try:
                r = await client.post("/api/v1/ingest", content=body, headers=_headers(token))
                results.append((r.status_code, time.perf_counter() - t0))
            except httpx.HTTPError:
                results.append((-1, time.perf_counter() - t0))
            await asyncio.sleep(max(0.0, batch_seconds - (time.perf_counter() - t0)))
        return results

    async def main() -> list[tuple[int, float]]:
        limits = httpx.Limits(max_connections=len(tokens) + 4)
        async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:
            per = await asyncio.gather(*(agent(client, i, t) for i, t in enumerate(tokens)))
        return [x for xs in per for x in xs]

    out.put(asyncio.run(main()))


class RawClient:
    """A minimal keep-alive HTTP/1.1 GET client on asyncio streams.

    httpx costs enough CPU per request that 220 concurrent clients in one process measure their
    own queueing more than the server; this one parses only the status line and Content-Length.
    """

    def __init__(self, base: str) -> None:
        host_port = base.removeprefix("http://")
        self.host, port = host_port.split(":")
        self.port = int(port)
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def get(self, path: str, token: str) -> tuple[int, float]:
        """GET ``path`` with a bearer token; the status code and Retry-After (0 if none)."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        request = (
            f"GET {path} HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer {token}\r\n\r\n"
        )
        try:
            self.writer.write(request.encode())
            head = await self.reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            code = int(lines[0].split()[1])
            length = 0
            retry_after = 0.0
            close = False
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.lower() == "content-length":
                    length = int(value)
                elif name.lower() == "retry-after":
                    retry_after = float(value)
                elif name.lower() == "connection" and value.strip().lower() == "close":
                    close = True
            await self.reader.readexactly(length)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            await self.close()
            raise
        if close:
            await self.close()
        return code, retry_after

    async def close(self) -> None:
        """Drop the connection (the next get opens a new one)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def load_process(
    base: str, reader: str, readers: int, flooders: int, seconds: float, nodes: int, out: Any
) -> None:
    """Closed-loop readers and bad-token flooders for ``seconds``; results to ``out``."""
    now = datetime.now(UTC).replace(microsecond=0)
    week = (now - timedelta(days=7)).isoformat().replace("+00:00", "Z")
    paths = [
        "/api/v1/gpus",
        "/api/v1/alerts",
        "/api/v1/gpus/GPU-{n:03d}-0/series?metric=sm_active",
        "/api/v1/gpus/GPU-{n:03d}-1/series?metric=power_watts&step=1h&start=" + week,
        "/api/v1/jobs",
        "/api/v1/reports/cost?group_by=team",
    ]

    async def timed(client: RawClient, path: str, token: str) -> tuple[int, float]:
        try:
            return await asyncio.wait_for(client.get(path, token), HANG_SECONDS)
        except TimeoutError:
            await client.close()
            return -1, 0.0
        except (OSError, asyncio.IncompleteReadError, ValueError):
            return -2, 0.0

    async def read(i: int) -> list[tuple[str, int, float]]:
        rng = random.Random(i)
        client = RawClient(base)
        results: list[tuple[str, int, float]] = []
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            template = paths[rng.randrange(len(paths))]
            path = template.format(n=rng.randrange(nodes))
            kind = template.split("?")[0].split("/")[-1]
            t0 = time.perf_counter()
            code, retry_after = await timed(client, path, reader)
            results.append((kind, code, time.perf_counter() - t0))
            # Readers (dashboards, the report CLI) honour Retry-After; the flood below does not.
            await asyncio.sleep(retry_after)
        await client.close()
        return results

    async def flood(i: int) -> list[tuple[str, int, float]]:
        client = RawClient(base)
        results: list[tuple[str, int, float]] = []
        stop = time.monotonic() + seconds
        fixed = f"gw_flood{i}"
        k = 0
        while time.monotonic() < stop:
            token = fixed if k % 2 else "gw_" + secrets.token_urlsafe(24)
            k += 1
            t0 = time.perf_counter()
            code, _ = await timed(client, "/api/v1/gpus", token)
            results.append(("bad-token", code, time.perf_counter() - t0))
        await client.close()
        return results

    async def main() -> list[tuple[str, int, float]]:
        tasks = [read(i) for i in range(readers)]
        tasks += [flood(i) for i in range(flooders)]
        per = await asyncio.gather(*tasks)
        return [x for xs in per for x in xs]

    out.put(asyncio.run(main()))


def run(kind: str, args: argparse.Namespace) -> None:
    with fresh_database(kind) as url:
        gpuwarden(url, "migrate")
        tokens = [
            gpuwarden(url, "token", "create", "--role", "agent", "--node", f"node-{i:03d}")
            .strip()
            .splitlines()[-1]
            for i in range(args.agents)
        ]
        reader = gpuwarden(url, "token", "create", "--role", "reader").strip().splitlines()[-1]
        admin = gpuwarden(url, "token", "create", "--role", "admin").strip().splitlines()[-1]
        with served(url) as (base, _proc):
            seed(base, tokens, admin, args.seed_minutes)
            _settle(base)
            ctx = mp.get_context("spawn")
            q_agents, q_load = ctx.Queue(), ctx.Queue()
            p_agents = ctx.Process(
                target=agents_process,
                args=(base, tokens, args.batch_seconds, args.seconds, q_agents),
            )
            p_load = ctx.Process(
                target=load_process,
                args=(
                    base,
                    reader,
                    args.readers,
                    args.flooders,
                    args.seconds,
                    args.agents,
                    q_load,
                ),
            )
            p_agents.start()
            p_load.start()
            shipped = q_agents.get(timeout=args.seconds + 120)
            load = q_load.get(timeout=args.seconds + 120)
            p_agents.join(30)
            p_load.join(30)
            server_side = _ingest_histogram(base)
            healthz0 = time.perf_counter()
            httpx.get(base + "/healthz", timeout=30).raise_for_status()
            healthz = time.perf_counter() - healthz0
    report(kind, args, shipped, load, healthz)
    print(f"server-side ingest handler time (from its histogram): {server_side}")


def _settle(base: str, timeout: float = 90.0) -> None:
    """Wait (bounded) until the seed's rollups are done (the count of recomputed buckets stops
    moving for a rollup interval): measure the steady state, not the seed's backlog."""
    deadline = time.monotonic() + timeout
    last, still = -1.0, 0
    while time.monotonic() < deadline:
        text = httpx.get(base + "/metrics", timeout=30).text
        done = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("gpuwarden_rollup_buckets_recomputed_total ")
        )
        still = still + 1 if done == last and done > 0 else 0
        if still >= 16:
            return
        last = done
        time.sleep(1)


def _ingest_histogram(base: str) -> str:
    """How many batches the handler itself took over 0.25 / 1 / 2.5 s (decode, validate, store)."""
    text = httpx.get(base + "/metrics", timeout=30).text
    buckets: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("gpuwarden_ingest_batch_duration_seconds_bucket"):
            le = line.split('le="')[1].split('"')[0]
            buckets[le] = float(line.rsplit(" ", 1)[1])
    total = buckets.get("+Inf", 0.0)
    over = {le: total - buckets.get(le, total) for le in ("0.25", "1.0", "2.5")}
    return f"{total:.0f} batches, over 0.25 s: {over['0.25']:.0f}, over 1 s: {over['1.0']:.0f}"


def report(
    kind: str,
    args: argparse.Namespace,
    shipped: list[tuple[int, float]],
    load: list[tuple[str, int, float]],
    healthz_s: float,
) -> None:
    ok = [dt for code, dt in shipped if code == 200]
    errors = sum(1 for code, _ in shipped if code != 200)
    print(
        f"\n== {kind}: {args.agents} agents (a batch each {args.batch_seconds:g} s), "
        f"{args.readers} readers, {args.flooders} bad-token flooders, {args.seconds:g} s"
    )
    if ok:
        print(
            f"agents: {len(shipped)} batches, {errors} errors, ingest p50 "
            f"{percentile(ok, 50) * 1000:.0f} ms, p99 {percentile(ok, 99) * 1000:.0f} ms, "
            f"max {max(ok) * 1000:.0f} ms"
        )
    else:
        print(f"agents: {len(shipped)} batches, {errors} errors, none stored")
    for kinds, label in (
        ({"bad-token"}, "bad-token flood"),
        ({k for k, _, _ in load} - {"bad-token"}, "readers (all routes)"),
    ):
        rows = [(c, dt) for k, c, dt in load if k in kinds]
        if not rows:
            continue
        codes = Counter(c for c, _ in rows)
        times = [dt for _, dt in rows]
        late = sum(1 for dt in times if dt > READ_DEADLINE_SECONDS)
        named = ", ".join(
            f"{'timeout' if c == -1 else 'conn-error' if c == -2 else c}: {n}"
            for c, n in sorted(codes.items())
        )
        print(
            f"{label}: {len(rows)} answers ({named}); p50 {percentile(times, 50) * 1000:.0f} ms, "
            f"p99 {percentile(times, 99) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms, "
            f"{late} over {READ_DEADLINE_SECONDS:g} s"
        )
    for route in sorted({k for k, _, _ in load} - {"bad-token"}):
        rows = [(c, dt) for k, c, dt in load if k == route]
        codes = Counter(c for c, _ in rows)
        times = [dt for _, dt in rows]
        print(
            f"  {route:>8}: {dict(sorted(codes.items()))}, "
            f"p99 {percentile(times, 99) * 1000:.0f} ms"
        )
    print(f"/healthz right after: {healthz_s * 1000:.0f} ms")
    bad = sum(1 for _, c, _ in load if (c >= 500 and c != 503) or c < 0)
    met = errors == 0 and ok and percentile(ok, 99) < 1.0 and bad == 0
    print(f"target (agents 0 errors, p99 < 1 s; no 500, no hang): {'MET' if met else 'NOT MET'}")


REPLAY_TIMEOUT_SECONDS = 30.0


async def _replay_one(
    client: httpx.AsyncClient, token: str, body: bytes, rng: random.Random
) -> list[tuple[int, float, int]]:
    """(status, seconds, samples stored) of each attempt until the batch is stored."""
    headers = _headers(token) | {"X-Request-Timeout": f"{REPLAY_TIMEOUT_SECONDS:g}"}
    tries = []
    while True:
        t0 = time.perf_counter()
        r = await client.post("/api/v1/ingest", content=body, headers=headers)
        took = time.perf_counter() - t0
        stored = r.json().get("samples_stored", 0) if r.status_code == 200 else 0
        tries.append((r.status_code, took, stored))
        if r.status_code == 200:
            return tries
        if r.status_code not in (429, 503):
            raise RuntimeError(f"{r.status_code}: {r.text[:200]}")
        # As the agent: Retry-After plus up to as much again at random, so senders spread out.
        wait = float(r.headers.get("Retry-After", "1"))
        await asyncio.sleep(wait * (1 + rng.random()))


def replay(kind: str, args: argparse.Namespace) -> None:
    """The spool-replay flood against one `gpuwarden serve` with default settings."""
    rng = random.Random(7)
    with fresh_database(kind) as url:
        gpuwarden(url, "migrate")
        tokens = [
            gpuwarden(url, "token", "create", "--role", "agent", "--node", f"node-{i:03d}")
            .strip()
            .splitlines()[-1]
            for i in range(args.replay)
        ]
        start = datetime.now(UTC) - timedelta(seconds=POLL_SECONDS * (args.replay_polls + 10))
        stamps = [start + timedelta(seconds=POLL_SECONDS * k) for k in range(args.replay_polls)]
        bodies = [batch(i, stamps, rng) for i in range(args.replay)]
        with served(url) as (base, _proc):

            async def flood() -> list[list[tuple[int, float, int]]]:
                limits = httpx.Limits(max_connections=args.replay * 2)
                async with httpx.AsyncClient(
                    base_url=base, timeout=REPLAY_TIMEOUT_SECONDS, limits=limits
                ) as client:
                    return await asyncio.gather(
                        *(
                            _replay_one(client, t, b, rng)
                            for t, b in zip(tokens, bodies, strict=True)
                        )
                    )

            t0 = time.perf_counter()
            per_sender = asyncio.run(flood())
            all_stored = time.perf_counter() - t0
    attempts = [a for tries in per_sender for a in tries]
    codes = Counter(code for code, _, _ in attempts)
    refused = [took for code, took, _ in attempts if code != 200]
    accepted = [took for code, took, _ in attempts if code == 200]
    expected = args.replay * args.replay_polls * GPUS_PER_NODE
    stored = sum(n for _, _, n in attempts)
    print(
        f"[{kind}] replay flood: {args.replay} senders x {args.replay_polls * GPUS_PER_NODE} "
        f"samples at once; answers {dict(codes)}; "
        f"refused p50/max {1000 * percentile(refused or [0], 50):.0f}/"
        f"{1000 * max(refused or [0]):.0f} ms; "
        f"stored p50/max {1000 * percentile(accepted, 50):.0f}/{1000 * max(accepted):.0f} ms "
        f"(timeout {REPLAY_TIMEOUT_SECONDS:.0f} s); every sample stored after {all_stored:.1f} s; "
        f"stored {stored} of {expected} ({'each once' if stored == expected else 'MISMATCH'})"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--agents", type=int, default=50)
    p.add_argument("--batch-seconds", type=float, default=30.0)
    p.add_argument("--readers", type=int, default=200)
    p.add_argument("--flooders", type=int, default=20)
    p.add_argument("--seed-minutes", type=int, default=30)
    p.add_argument("--replay", type=int, default=0, help="senders of the spool-replay flood")
    p.add_argument("--replay-polls", type=int, default=500)
    args = p.parse_args()
    print(f"machine: {machine()}")
    for kind in ["sqlite", "postgresql"] if args.db == "both" else [args.db]:
        if args.replay:
            replay(kind, args)
        else:
            run(kind, args)


if __name__ == "__main__":
    main()
