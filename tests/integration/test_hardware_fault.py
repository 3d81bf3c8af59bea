"""hardware_fault over real stored samples: hardware XIDs, row-remap failure, counter rises.

Application XIDs (13, 31, 43) and a high but unchanged counter level are not faults; a hardware
XID, a row-remap failure, or a rise of the cumulative remapped-rows or PCIe-replay counters
within the window is. Checked on raw samples (short windows) and 1-minute rollups (long ones).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, select

from service.db import windows_repo
from service.db.schema import gpus
from tests.integration.cost_data import roll_up, store_series
from tests.support import FakeClock

CASES: dict[str, tuple[list[dict[str, Any]], bool]] = {
    "GPU-app-xid-13": ([{"sm_active": 0.5}, {"sm_active": 0.0, "xid_last": 13}], False),
    "GPU-app-xid-31": ([{"xid_last": 31}, {"xid_last": 43}], False),
    "GPU-hw-xid-79": ([{"sm_active": 0.5}, {"xid_last": 79}], True),
    "GPU-hw-xid-48": ([{"xid_last": 48}, {"sm_active": 0.1}], True),
    "GPU-remap-failed": ([{"row_remap_failure": 0}, {"row_remap_failure": 1}], True),
    "GPU-remap-ok": ([{"row_remap_failure": 0}, {"row_remap_failure": 0}], False),
    "GPU-replays-flat": ([{"pcie_replays": 5000}, {"pcie_replays": 5000}], False),
    "GPU-replays-rose": ([{"pcie_replays": 5000}, {"pcie_replays": 5003}], True),
    "GPU-rows-flat": ([{"remapped_rows_uncorrectable": 2}] * 2, False),
    "GPU-rows-rose": (
        [{"remapped_rows_uncorrectable": 2}, {"remapped_rows_uncorrectable": 3}],
        True,
    ),
}


@pytest.mark.parametrize("window", [600.0, 6 * 3600.0], ids=["raw", "rollup"])
def test_hardware_fault_by_cause(engine: Engine, clock: FakeClock, window: float):
    start = clock() - timedelta(minutes=5)
    for uuid, (series, _) in CASES.items():
        # Two minutes apart, so the rise spans two 1-minute buckets in the rollup case.
        store_series(engine, clock, uuid=uuid, start=start, metrics=series, interval_seconds=120)
    roll_up(engine)
    with engine.connect() as conn:
        ids = dict(conn.execute(select(gpus.c.uuid, gpus.c.id)).all())
        stats = windows_repo.window_stats(
            conn,
            windows={window: ["hardware_fault"]},
            now=clock(),
            gpu_ids=ids.values(),
        )[window]
    got = {uuid: stats.get(ids[uuid], {}).get("hardware_fault") for uuid in CASES}
    want = {uuid: faulty for uuid, (_, faulty) in CASES.items()}
    assert {u: (s is not None and s.max == 1.0) for u, s in got.items()} == want
