"""The host side of a GPU process, read from /proc (issue 47): what tells a keep-alive loop or a
hung job from real work without touching the job's code.

Per process on a GPU: its CPU seconds, the bytes it and its descendants (DataLoader workers)
read and wrote through any call (``rchar``/``wchar`` of /proc/<pid>/io: files, pipes and
sockets alike), its main thread's voluntary context switches and how many descendants it has;
running totals, so the central takes differences over a window. A process /proc does not show
(another PID namespace, gone, or not readable) gets no figures: the verdict is then unverified.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_MAX_DESCENDANTS = 256  # a process tree larger than this is read in part (bounded cost)


class ProcessLike(Protocol):
    """A GPU process reading (service.collectors.backend.ProcessReading)."""

    pid: int
    host: HostTotals | None


@dataclass(frozen=True, slots=True)
class HostTotals:
    """Running totals of one GPU process and its descendants (see the module's docstring)."""

    cpu_seconds: float
    read_bytes: int
    write_bytes: int
    voluntary_switches: int
    children: int


def _cpu_seconds(stat: str) -> float:
    # Fields after the command name (which may hold spaces and parentheses): utime is the 12th.
    rest = stat[stat.rindex(")") + 2 :].split()
    return (int(rest[11]) + int(rest[12])) / _TICKS_PER_SECOND


def _io(text: str) -> tuple[int, int]:
    fields = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
    return int(fields.get("rchar", 0)), int(fields.get("wchar", 0))


def _switches(status: str) -> int:
    for line in status.splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    return 0


def _children(proc: Path, pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in (proc / str(pid) / "task").iterdir():
            text = (task / "children").read_text()
            out += [int(c) for c in text.split()]
    except OSError:
        return out
    return out


def read_host(pid: int, proc_root: Path = Path("/proc")) -> HostTotals | None:
    """The totals of ``pid`` and its descendants, None when /proc does not show ``pid``."""
    try:
        base = proc_root / str(pid)
        cpu = _cpu_seconds((base / "stat").read_text())
        read, write = _io((base / "io").read_text())
        switches = _switches((base / "status").read_text())
    except (OSError, ValueError, IndexError):
        return None
    seen = {pid}
    todo = _children(proc_root, pid)
    while todo and len(seen) <= _MAX_DESCENDANTS:
        child = todo.pop()
        if child in seen:
            continue
        seen.add(child)
        try:
            cpu += _cpu_seconds((proc_root / str(child) / "stat").read_text())
            r, w = _io((proc_root / str(child) / "io").read_text())
        except (OSError, ValueError, IndexError):
            continue  # a worker that just ended: its totals leave with it
        read, write = read + r, write + w
        todo += _children(proc_root, child)
    return HostTotals(cpu, read, write, switches, len(seen) - 1)


def host_fields(host: HostTotals | None) -> dict[str, float | int]:
    """The wire fields of a process's host side (none where /proc did not show it: an agent
    older than these fields, or one that cannot read /proc, sends the same)."""
    if host is None:
        return {}
    return {
        "host_cpu_seconds": host.cpu_seconds,
        "host_read_bytes": host.read_bytes,
        "host_write_bytes": host.write_bytes,
        "host_voluntary_switches": host.voluntary_switches,
        "host_children": host.children,
    }


def read_hosts(processes: Sequence[ProcessLike], proc_root: Path = Path("/proc")) -> None:
    """Give each process with a pid its host side (read once per pid per poll)."""
    cache: dict[int, HostTotals | None] = {}
    for p in processes:
        if p.pid > 0:
            if p.pid not in cache:
                cache[p.pid] = read_host(p.pid, proc_root)
            p.host = cache[p.pid]
