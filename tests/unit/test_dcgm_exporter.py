"""dcgm-exporter text mapped to canonical names and units, both hostname spellings, job labels."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from service.collectors.backend import BackendError
from service.collectors.dcgm_exporter import DcgmExporterBackend, parse_exposition
from service.exposition.dcgm import dcgm_families
from service.exposition.render import render
from service.exposition.types import FleetGpu
from service.vocabulary import DCGM_FIELDS, METRICS_BY_NAME, ActivitySource

L0 = 'gpu="0",UUID="GPU-aaa",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="node-7"'
L1 = 'gpu="1",UUID="GPU-bbb",device="nvidia1",modelName="NVIDIA A100-SXM4-40GB",hostname="node-7",hpc_job="slurm-991"'
L2 = 'gpu="2",UUID="GPU-ccc",device="nvidia2",modelName="NVIDIA H100 80GB HBM3",Hostname="node-7",pod="trainer-0",namespace="ml"'

TEXT = f"""# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).
# TYPE DCGM_FI_DEV_SM_CLOCK gauge
DCGM_FI_DEV_SM_CLOCK{{{L0}}} 1980
DCGM_FI_DEV_SM_CLOCK{{{L1}}} 1410
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{{{L0}}} 100
DCGM_FI_DEV_GPU_UTIL{{{L1}}} 37
DCGM_FI_DEV_GPU_UTIL{{{L2}}} 0
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{{{L0}}} 20480
DCGM_FI_DEV_FB_USED{{{L1}}} 1024
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{{{L0}}} 60000
DCGM_FI_DEV_FB_FREE{{{L1}}} 39000
# TYPE DCGM_FI_DEV_FB_RESERVED gauge
DCGM_FI_DEV_FB_RESERVED{{{L0}}} 1000
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{{{L0}}} 612.5
# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{L0}}} 9876543210
# TYPE DCGM_FI_DEV_XID_ERRORS gauge
DCGM_FI_DEV_XID_ERRORS{{{L0}}} 0
DCGM_FI_DEV_XID_ERRORS{{{L1}}} 48
# TYPE DCGM_FI_PROF_SM_ACTIVE gauge
DCGM_FI_PROF_SM_ACTIVE{{{L0}}} 0.97
# TYPE DCGM_FI_PROF_PIPE_TENSOR_ACTIVE gauge
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{L0}}} 0.94
# TYPE DCGM_FI_PROF_PCIE_TX_BYTES gauge
DCGM_FI_PROF_PCIE_TX_BYTES{{{L0}}} 123456
"""


def test_fields_map_to_canonical_names_and_units():
    exp = parse_exposition(TEXT)
    by = {r.uuid: r for r in exp.readings}
    a = by["GPU-aaa"].metrics
    assert a["sm_active"] == 0.97 and a["tensor_active"] == 0.94
    assert a["gpu_util"] == 1.0
    assert a["sm_clock_hz"] == 1.98e9
    assert a["fb_used_bytes"] == 20480 * 2**20
    assert a["fb_total_bytes"] == (20480 + 60000 + 1000) * 2**20
    assert a["power_watts"] == 612.5
    assert a["energy_joules"] == pytest.approx(9876543.21)
    assert a["pcie_tx_bytes_per_second"] == 123456
    assert "xid_last" not in a  # 0 means "no XID": absent
    assert by["GPU-aaa"].source is ActivitySource.DCGM
    b = by["GPU-bbb"].metrics
    assert b["gpu_util"] == pytest.approx(0.37)
    assert b["xid_last"] == 48
    assert "sm_active" not in b  # no profiling fields: coarse duty cycle, flagged
    assert by["GPU-bbb"].source is ActivitySource.NVML


def test_both_hostname_spellings_and_job_labels():
    exp = parse_exposition(TEXT)
    assert exp.hostname == "node-7"
    models = {d.uuid: d.model for d in exp.devices}
    assert models["GPU-bbb"] == "NVIDIA A100-SXM4-40GB"
    jobs = {(j.gpu_uuid, j.job_id) for j in exp.jobs}
    assert jobs == {("GPU-bbb", "slurm-991"), ("GPU-ccc", "k8s:ml/trainer-0")}


def test_backend_scrapes_and_flags_gpus_that_vanish():
    texts = [TEXT, TEXT.replace("GPU-ccc", "GPU-aaa")]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=texts.pop(0) if texts else "")

    b = DcgmExporterBackend(
        url="http://exporter:9400/metrics",
        client=httpx.Client(transport=httpx.MockTransport(handler)),
    )
    now = datetime(2026, 12, 2, tzinfo=UTC)
    assert len(b.sample(now).readings) == 3
    b.sample(now)
    lost = {d.uuid for d in b.devices() if d.lost}
    assert lost == {"GPU-ccc"}


def test_unreachable_exporter_is_a_backend_error():
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    b = DcgmExporterBackend(
        url="http://exporter:9400/metrics",
        client=httpx.Client(transport=httpx.MockTransport(handler)),
    )
    with pytest.raises(BackendError, match="cannot scrape"):
        b.sample(datetime(2026, 12, 2, tzinfo=UTC))


def test_compat_exposition_scrapes_back_to_the_values_it_was_written_from():
    """One table drives both directions: what /metrics writes in DCGM units, the dcgm-exporter
    backend reads back as the same canonical values."""
    gib = 2**30
    values = {
        "gpu_util": 0.37,
        "mem_copy_util": 0.12,
        "fb_used_bytes": 20 * gib,
        "fb_total_bytes": 80 * gib,
        "fb_free_bytes": 59 * gib,  # 1 GiB reserved by the driver
        "enc_util": 0.09,
        "dec_util": 0.46,
        "power_watts": 312.5,
        "energy_joules": 123456.789,
        "temperature_celsius": 61.0,
        "sm_clock_hz": 1.98e9,
        "xid_last": 79,
        "gr_engine_active": 0.5,
        "sm_active": 0.25,
        "sm_occupancy": 0.125,
        "tensor_active": 0.0625,
        "dram_active": 0.75,
        "pcie_tx_bytes_per_second": 1.5e9,
        "pcie_rx_bytes_per_second": 2.5e8,
        "nvlink_tx_bytes_per_second": 4.0e10,
        "nvlink_rx_bytes_per_second": 3.0e10,
        "row_remap_failure": 1,
        "remapped_rows_uncorrectable": 3,
        "pcie_replays": 17,
        "ecc_dbe_errors": 2,
        "retired_pages_dbe": 1,
        "retired_pages_pending": 1,
        "nvlink_crc_errors": 40,
        "nvlink_replay_errors": 7,
        "nvlink_recovery_errors": 1,
        "clocks_event_reasons": 0x44,
    }
    assert {f.metric for f in DCGM_FIELDS} <= set(values)
    reading = FleetGpu(
        node="node-7",
        index=3,
        uuid="GPU-rt",
        model="NVIDIA H100 80GB HBM3",
        last_sample_at=datetime(2026, 12, 2, 8, 0, tzinfo=UTC),
        values={k: float(v) for k, v in values.items()},
    )
    families = dcgm_families([reading])

    class Families:
        def collect(self) -> list[Metric]:
            return families

    registry = CollectorRegistry()
    registry.register(Families())
    exp = parse_exposition(render(registry)[0].decode())

    (dev,) = exp.devices
    assert (dev.uuid, dev.index, dev.model) == ("GPU-rt", 3, "NVIDIA H100 80GB HBM3")
    (got,) = exp.readings
    assert got.source == ActivitySource.DCGM
    assert set(got.metrics) == set(values)
    for name, want in values.items():
        assert got.metrics[name] == pytest.approx(want, rel=1e-9), name


def test_dcgm_table_names_each_field_once_and_only_canonical_metrics():
    names = [f.name for f in DCGM_FIELDS]
    assert len(names) == len(set(names))
    assert {f.metric for f in DCGM_FIELDS} <= set(METRICS_BY_NAME)
