"""A private PostgreSQL cluster (initdb on a free loopback port) that a test may stop and start,
and a streaming replica of it (pg_basebackup -R, a second server on another port).

The shared PostgreSQL serves every other test; an outage test needs one of its own. As root the
cluster runs as the ``postgres`` system user (initdb refuses root); its files live in a fresh
directory under the system temp dir, removed afterwards. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from tests.support import free_port


def postgres_bin() -> Path:
    """The newest PostgreSQL server binaries directory (Debian layout)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4])
    )
    if not found:
        raise RuntimeError("initdb not found under /usr/lib/postgresql/*/bin (see test-services)")
    return Path(found[-1]).parent


class Cluster:
    """One private cluster: ``url`` for SQLAlchemy, ``stop()``/``start()`` to make outages."""

    def __init__(self, root: Path, port: int) -> None:
        self.bin = postgres_bin()
        self.data = root / "data"
        self.log = root / "postgres.log"
        self.port = port
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
        self.admin_url = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    def _run(self, *args: str | Path, timeout: float = 60) -> None:
        cmd = [str(a) for a in args]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=timeout)

    def init(self) -> None:
        """Create the cluster (trust authentication on loopback only)."""
        self._run(
            self.bin / "initdb", "-D", self.data, "-U", "postgres", "-A", "trust",
            "--no-sync", "-E", "UTF8",
        )  # fmt: skip

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' "
            "-c fsync=off -c max_connections=100"
        )
        self._run(
            self.bin / "pg_ctl", "-D", self.data, "-l", self.log, "-o", options, "-w",
            "-t", "60", "start",
        )  # fmt: skip

    def base_backup_of(self, primary: Cluster) -> None:
        """Fill this cluster's data directory with a copy of ``primary`` that, once started,
        follows it as a hot standby (``-R`` writes standby.signal and primary_conninfo); a fast
        checkpoint, or the copy waits for a spread one (minutes)."""
        self._run(
            self.bin / "pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port),
            "-U", "postgres", "-D", self.data, "-R", "-X", "stream", "-c", "fast", "--no-sync",
        )  # fmt: skip

    def sql(self, statement: str) -> None:
        """Run one statement on this server's maintenance database (autocommit)."""
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(statement.encode())

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``immediate`` is a crash: no shutdown checkpoint)."""
        self._run(self.bin / "pg_ctl", "-D", self.data, "-m", mode, "-w", "-t", "60", "stop")


@contextmanager
def _cluster_dir(make: Callable[[Cluster], None]) -> Iterator[Cluster]:
    root = Path(tempfile.mkdtemp(prefix="gpuwarden-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    cluster = Cluster(root, free_port())
    try:
        make(cluster)
        cluster.start()
        yield cluster
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
            cluster.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def private_cluster() -> Iterator[Cluster]:
    """A started private cluster, stopped and removed at the end."""
    with _cluster_dir(Cluster.init) as cluster:
        yield cluster


@contextmanager
def streaming_replica(primary: Cluster) -> Iterator[Cluster]:
    """A started hot standby streaming from ``primary``, stopped and removed at the end."""
    with _cluster_dir(lambda c: c.base_backup_of(primary)) as replica:
        yield replica
