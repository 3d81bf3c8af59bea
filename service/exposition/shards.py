"""Shards of /metrics: each node's GPUs in one of ``count`` shards, so Prometheus can scrape a
large fleet as several targets (``GET /metrics?shard=i/n``)."""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

# More shards than this split no fleet usefully (a shard per node is at most thousands).
MAX_SHARDS = 1024
_SHARD = re.compile(r"^(\d{1,4})/(\d{1,4})$")


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count``; shard 0 also carries the fleet-wide and service families."""

    index: int
    count: int

    def holds(self, node: str) -> bool:
        """Whether ``node``'s GPUs belong to this shard (a CRC-32 of its name, modulo count:
        the same on every replica and every scrape)."""
        return zlib.crc32(node.encode()) % self.count == self.index

    @property
    def carries_fleet(self) -> bool:
        """Whether this shard exports the fleet-wide families and the service's own."""
        return self.index == 0


def parse_shard(text: str) -> Shard:
    """``i/n`` (0 <= i < n <= MAX_SHARDS) as a Shard; ValueError naming the rule otherwise."""
    found = _SHARD.match(text.strip())
    if found is None:
        raise ValueError(f"{text!r}: give the shard as i/n, e.g. 0/4 (shards 0 to 3 of 4)")
    index, count = int(found.group(1)), int(found.group(2))
    if not 1 <= count <= MAX_SHARDS:
        raise ValueError(f"{text!r}: the number of shards must be 1 to {MAX_SHARDS}")
    if index >= count:
        raise ValueError(f"{text!r}: shards of {count} are numbered 0 to {count - 1}")
    return Shard(index=index, count=count)
