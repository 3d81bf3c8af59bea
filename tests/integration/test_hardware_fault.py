"""hardware_fault over real stored samples: hardware XIDs, row-remap failure, counter rises.

Application XIDs (13, 31, 43) and a high but unchanged counter level are not faults; a hardware
XID, a row-remap failure or pending page retirement, or a rise of the cumulative remapped-rows,
PCIe-replay, double-bit ECC, retired-page or NVLink-recovery counters within the window is. Checked on raw samples (short windows) and 1-minute rollups (long ones).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, select

from service.db import gpus_repo, sample_facts_repo, windows_repo
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
    # DCGM's memory and NVLink health watches (issue 49).
    "GPU-dbe-flat": ([{"ecc_dbe_errors": 4}] * 2, False),
    "GPU-dbe-rose": ([{"ecc_dbe_errors": 4}, {"ecc_dbe_errors": 5}], True),
    "GPU-retired-rose": ([{"retired_pages_dbe": 1}, {"retired_pages_dbe": 2}], True),
    "GPU-retire-pending": ([{"retired_pages_pending": 0}, {"retired_pages_pending": 1}], True),
    "GPU-nvlink-recovered": (
        [{"nvlink_recovery_errors": 0}, {"nvlink_recovery_errors": 1}],
        True,
    ),
    # CRC errors and replays are link-level retries the link corrects: not a fault.
    "GPU-nvlink-crc-rose": (
        [
            {"nvlink_crc_errors": 10, "nvlink_replay_errors": 1},
            {"nvlink_crc_errors": 90, "nvlink_replay_errors": 4},
        ],
        False,
    ),
    # A hardware slowdown is a state of the clocks, shown on the GPU, not a fault.
    "GPU-hw-slowdown": ([{"clocks_event_reasons": 0x40}] * 2, False),
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


def test_gpus_without_memory_readings_are_named_for_the_alert_text(
    engine: Engine, clock: FakeClock
) -> None:
    start = clock() - timedelta(minutes=5)
    store_series(engine, clock, uuid="GPU-mem", start=start,
                 metrics=[{"gpu_util": 0.0, "fb_used_bytes": 2**30}] * 3)  # fmt: skip
    store_series(engine, clock, uuid="GPU-nomem", start=start, metrics=[{"gpu_util": 0.0}] * 3)
    with engine.connect() as conn:
        got = sample_facts_repo.memory_unreported(
            conn, gpu_uuids=["GPU-mem", "GPU-nomem", "GPU-unknown"],
            since=start - timedelta(seconds=1), until=clock(),
        )  # fmt: skip
    assert got == {"GPU-nomem"}


def test_gpu_api_names_the_clocks_event_reasons(engine: Engine, clock: FakeClock) -> None:
    start = clock() - timedelta(minutes=1)
    store_series(engine, clock, uuid="GPU-hot", start=start,
                 metrics=[{"gpu_util": 1.0, "clocks_event_reasons": 0x40 | 0x4}])  # fmt: skip
    store_series(engine, clock, uuid="GPU-cool", start=start, index=1,
                 metrics=[{"gpu_util": 1.0, "clocks_event_reasons": 0x4}])  # fmt: skip
    with engine.connect() as conn:
        rows = {
            g["uuid"]: g for g in gpus_repo.list_gpus(conn, now=clock(), start_skew_seconds=0.0)
        }
    assert rows["GPU-hot"]["clock_event_reasons"] == ["sw_power_cap", "hw_thermal_slowdown"]
    assert rows["GPU-hot"]["hw_slowdown"] is True
    assert (rows["GPU-cool"]["clock_event_reasons"], rows["GPU-cool"]["hw_slowdown"]) == (
        ["sw_power_cap"],
        False,
    )
