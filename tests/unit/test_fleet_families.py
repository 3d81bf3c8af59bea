"""The fleet families built from latest readings: names, units, labels, fleet figures, DCGM."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from prometheus_client.core import Metric

from service.costs.integrals import Thresholds
from service.costs.prices import PriceRow
from service.exposition.fleet import exported_name, fleet_families
from service.exposition.types import FleetGpu, FleetSnapshot, LostGpu
from service.vocabulary import METRICS, METRICS_BY_NAME

NOW = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)
GIB = 1024**3
H100 = "NVIDIA H100 80GB HBM3"


def reading(uuid: str, index: int = 0, **values: float) -> FleetGpu:
    return FleetGpu(
        node="node-a",
        index=index,
        uuid=uuid,
        model=H100,
        last_sample_at=NOW,
        values=dict(values),
        source="gpm",
        fb_total_bytes=80 * GIB,
    )


def by_name(families: list[Metric]) -> dict[str, Metric]:
    return {f.name: f for f in families}


def values_of(fam: Metric, uuid: str, key: str = "gpu_uuid") -> list[float]:
    return [s.value for s in fam.samples if s.labels.get(key) == uuid]


def test_names_carry_units():
    names = {m.name: exported_name(m) for m in METRICS}
    assert names["sm_active"] == "gpuwarden_gpu_sm_active_ratio"
    assert names["fb_used_bytes"] == "gpuwarden_gpu_fb_used_bytes"
    assert names["power_watts"] == "gpuwarden_gpu_power_watts"
    assert names["temperature_celsius"] == "gpuwarden_gpu_temperature_celsius"
    assert names["sm_clock_hz"] == "gpuwarden_gpu_sm_clock_hertz"
    assert names["energy_joules"] == "gpuwarden_gpu_energy_joules"  # a counter: + _total
    assert names["pcie_tx_bytes_per_second"] == "gpuwarden_gpu_pcie_tx_bytes_per_second"
    assert names["xid_last"] == "gpuwarden_gpu_xid_last"
    assert len(set(names.values())) == len(METRICS)


def test_per_gpu_gauges_have_labels_and_skip_absent_metrics():
    r = FleetGpu(
        node="node-a",
        index=3,
        uuid="GPU-x",
        model=H100,
        last_sample_at=NOW,
        values={"sm_active": 0.42, "power_watts": 310.0},
        job_id="slurm:1",
        user="alice",
        team="vision",
        project="resnet",
    )
    fams = by_name(fleet_families(FleetSnapshot([r]), thresholds=Thresholds(), now=NOW))
    (sample,) = fams["gpuwarden_gpu_sm_active_ratio"].samples
    assert sample.value == 0.42
    # The GPU's identity only: the job that holds it is on gpuwarden_gpu_job_info.
    assert sample.labels == {"node": "node-a", "gpu_index": "3", "gpu_uuid": "GPU-x", "model": H100}
    (job,) = fams["gpuwarden_gpu_job_info"].samples
    assert job.value == 1.0
    assert job.labels == {
        "node": "node-a",
        "gpu_uuid": "GPU-x",
        "job_id": "slurm:1",
        "job_node": "node-a",
        "user": "alice",
        "team": "vision",
        "project": "resnet",
    }
    assert fams["gpuwarden_gpu_power_watts"].samples[0].value == 310.0
    # Not measured means absent, never 0.
    assert fams["gpuwarden_gpu_tensor_active_ratio"].samples == []
    assert fams["gpuwarden_gpu_temperature_celsius"].samples == []
    assert fams["gpuwarden_gpu_last_sample_timestamp_seconds"].samples[0].value == NOW.timestamp()


def test_energy_is_a_counter():
    fams = by_name(
        fleet_families(
            FleetSnapshot([reading("GPU-a", energy_joules=1234.5)]),
            thresholds=Thresholds(),
            now=NOW,
        )
    )
    fam = fams["gpuwarden_gpu_energy_joules"]
    assert fam.type == "counter"
    assert fam.samples[0].name == "gpuwarden_gpu_energy_joules_total"
    assert METRICS_BY_NAME["energy_joules"].counter


def test_fb_total_falls_back_to_inventory():
    fams = by_name(
        fleet_families(
            FleetSnapshot([reading("GPU-a", sm_active=0.5)]), thresholds=Thresholds(), now=NOW
        )
    )
    assert values_of(fams["gpuwarden_gpu_fb_total_bytes"], "GPU-a") == [80 * GIB]


def test_fleet_figures_idle_held_and_waste():
    readings = [
        reading("GPU-busy", 0, sm_active=0.8, fb_used_bytes=40 * GIB),
        reading("GPU-held", 1, sm_active=0.0, fb_used_bytes=20 * GIB),
        reading("GPU-empty", 2, sm_active=0.01, fb_used_bytes=GIB // 2),
        reading("GPU-nodata", 3, power_watts=70.0),  # no activity figure: neither idle nor waste
        reading("GPU-fallback", 4, gpu_util=0.0, fb_used_bytes=2 * GIB),  # pre-Hopper
    ]
    snap = FleetSnapshot(
        readings, prices=[PriceRow("*H100*", 4.0, datetime(2026, 1, 1, tzinfo=UTC))]
    )
    fams = by_name(fleet_families(snap, thresholds=Thresholds(), now=NOW))

    def one(name: str) -> float:
        (s,) = fams[name].samples
        return s.value

    assert one("gpuwarden_fleet_gpus") == 5
    assert one("gpuwarden_fleet_gpus_idle") == 3
    assert one("gpuwarden_fleet_gpus_idle_held") == 2
    assert one("gpuwarden_fleet_gpus_unpriced") == 0
    assert one("gpuwarden_fleet_cost_usd_per_hour") == 20.0
    # The three idle GPUs waste their whole price; the busy one (SM 0.8, its other metrics
    # unreported: unclassified) wastes nothing, an unexplained 20% idle SM time being no
    # dollar figure; the no-data GPU wastes nothing.
    assert abs(one("gpuwarden_fleet_waste_usd_per_hour") - 3 * 4.0) < 1e-9
    waste = fams["gpuwarden_gpu_waste_usd_per_hour"]
    assert values_of(waste, "GPU-busy") == [0.0]
    assert values_of(waste, "GPU-held") == [4.0]
    assert values_of(waste, "GPU-nodata") == []
    assert "gpuwarden_fleet_wasted_usd_per_hour" not in fams
    assert values_of(fams["gpuwarden_gpu_idle"], "GPU-held") == [1.0]
    assert values_of(fams["gpuwarden_gpu_idle"], "GPU-busy") == [0.0]
    assert values_of(fams["gpuwarden_gpu_idle"], "GPU-nodata") == []


def test_gpus_by_state_follow_the_cause():
    readings = [
        reading("GPU-tensor", 0, sm_active=0.9, tensor_active=0.8, gr_engine_active=0.95),
        reading("GPU-copy", 1, sm_active=0.0, gr_engine_active=0.99, gpu_util=0.99,
                pcie_tx_bytes_per_second=27e9, pcie_rx_bytes_per_second=27e9),
        reading("GPU-held", 2, sm_active=0.0, gpu_util=0.0, fb_used_bytes=20 * GIB),
        reading("GPU-nodata", 3, power_watts=70.0),
    ]  # fmt: skip
    snap = FleetSnapshot(readings, lost=[LostGpu("node-b", 2, "GPU-l", H100)])
    fams = by_name(fleet_families(snap, thresholds=Thresholds(), now=NOW))
    got = {s.labels["state"]: s.value for s in fams["gpuwarden_fleet_gpus_by_state"].samples}
    assert got == {"working": 1, "underused": 1, "idle-held": 1, "idle": 0, "lost": 1,
                   "no-data": 1, "unclassified": 0, "sham": 0, "hung": 0}  # fmt: skip


def test_thresholds_come_from_settings_not_constants():
    snap = FleetSnapshot([reading("GPU-a", sm_active=0.2, fb_used_bytes=3 * GIB)])
    fams = by_name(
        fleet_families(snap, thresholds=Thresholds(idle=0.25, held_bytes=4 * GIB), now=NOW)
    )
    assert fams["gpuwarden_fleet_gpus_idle"].samples[0].value == 1
    assert fams["gpuwarden_fleet_gpus_idle_held"].samples[0].value == 0


def test_unpriced_models_are_counted_and_have_no_price_series():
    snap = FleetSnapshot([reading("GPU-a", sm_active=0.0)], prices=[])
    fams = by_name(fleet_families(snap, thresholds=Thresholds(), now=NOW))
    assert fams["gpuwarden_fleet_gpus_unpriced"].samples[0].value == 1
    assert fams["gpuwarden_gpu_price_usd_per_hour"].samples == []
    assert fams["gpuwarden_fleet_waste_usd_per_hour"].samples[0].value == 0


def test_lost_gpus_cost_as_their_own_line_and_are_never_waste():
    prices = [PriceRow("*H100*", 4.0, datetime(2026, 1, 1, tzinfo=UTC))]
    snap = FleetSnapshot([], lost=[LostGpu("node-b", 2, "GPU-l", H100)], prices=prices)
    fams = by_name(fleet_families(snap, thresholds=Thresholds(), now=NOW))
    (s,) = fams["gpuwarden_gpu_lost"].samples
    assert s.labels == {"node": "node-b", "gpu_index": "2", "gpu_uuid": "GPU-l", "model": H100}
    assert fams["gpuwarden_fleet_gpus_lost"].samples[0].value == 1
    assert fams["gpuwarden_fleet_lost_usd_per_hour"].samples[0].value == 4.0
    assert fams["gpuwarden_fleet_cost_usd_per_hour"].samples[0].value == 4.0
    assert fams["gpuwarden_fleet_waste_usd_per_hour"].samples[0].value == 0.0


def test_job_info_names_every_node_of_the_job_and_the_holder_of_a_lost_gpu():
    # job_node is the job's nodes joined as a native job alert's node ("node-a,node-b"), and a
    # lost GPU (no samples) still says who holds it, so GpuLost can name the job.
    held = {"job_id": "slurm:9", "user": "ana", "team": "vision", "project": "p"}
    a = replace(reading("GPU-a", sm_active=0.1), job_id="slurm:9", user="ana", team="vision",
                project="p")  # fmt: skip
    b = replace(a, uuid="GPU-b", node="node-b")
    free = reading("GPU-c", sm_active=0.1)
    lost = LostGpu("node-c", 1, "GPU-l", H100, "slurm:9", "ana", "vision", "p")
    both = replace(lost, node="node-a", index=0, uuid="GPU-a")  # lost, its last sample fresh
    snap = FleetSnapshot([a, b, free], lost=[lost, both])
    fams = by_name(fleet_families(snap, thresholds=Thresholds(), now=NOW))
    info = {s.labels["gpu_uuid"]: s.labels for s in fams["gpuwarden_gpu_job_info"].samples}
    assert sorted(info) == ["GPU-a", "GPU-b", "GPU-c", "GPU-l"]  # one series per GPU
    assert {info[u]["job_node"] for u in ("GPU-a", "GPU-b", "GPU-l")} == {"node-a,node-b,node-c"}
    assert info["GPU-l"] == {"node": "node-c", "gpu_uuid": "GPU-l", **held,
                             "job_node": "node-a,node-b,node-c"}  # fmt: skip
    assert info["GPU-c"]["job_id"] == "" and info["GPU-c"]["job_node"] == ""


def test_dcgm_compat_names_labels_and_units():
    r = reading(
        "GPU-d",
        5,
        sm_active=0.97,
        gpu_util=0.5,
        fb_used_bytes=2048 * 1024 * 1024,
        fb_free_bytes=(80 * 1024 - 2048 - 512) * 1024 * 1024,
        energy_joules=10.0,
        sm_clock_hz=1.98e9,
        temperature_celsius=61.0,
    )
    plain = by_name(fleet_families(FleetSnapshot([r]), thresholds=Thresholds(), now=NOW))
    assert not any(n.startswith("DCGM_") for n in plain)
    fams = by_name(
        fleet_families(FleetSnapshot([r]), thresholds=Thresholds(), now=NOW, dcgm_compat=True)
    )
    (sm,) = fams["DCGM_FI_PROF_SM_ACTIVE"].samples
    assert sm.value == 0.97
    assert sm.labels == {
        "gpu": "5",
        "UUID": "GPU-d",
        "device": "nvidia5",
        "modelName": H100,
        "Hostname": "node-a",
        "instance": "node-a",
    }
    assert fams["DCGM_FI_DEV_GPU_UTIL"].samples[0].value == 50.0  # percent
    assert fams["DCGM_FI_DEV_FB_USED"].samples[0].value == 2048.0  # MiB
    assert fams["DCGM_FI_DEV_FB_FREE"].samples[0].value == 80 * 1024 - 2048.0 - 512.0
    assert fams["DCGM_FI_DEV_FB_RESERVED"].samples[0].value == 512.0
    assert fams["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].samples[0].value == 10_000.0  # mJ
    assert abs(fams["DCGM_FI_DEV_SM_CLOCK"].samples[0].value - 1980.0) < 1e-9  # MHz
    assert fams["DCGM_FI_DEV_GPU_TEMP"].samples[0].value == 61.0
    assert fams["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"].samples == []


def test_a_new_job_on_a_gpu_changes_one_series_not_one_per_family():
    # The same GPU read under two jobs: every per-GPU family keeps the same series (the job is
    # none of their labels); only gpuwarden_gpu_job_info names the job, one series per GPU.
    values = {m.name: (1.0 if m.kind == "int" else 0.5) for m in METRICS}
    prices = [PriceRow("*", 2.0, NOW)]
    series: list[set[tuple[str, tuple[tuple[str, str], ...]]]] = []
    for job in ("slurm:1", "slurm:2"):
        r = replace(reading("GPU-j"), values=values, job_id=job, user="ana", team="vision")
        fams = fleet_families(FleetSnapshot([r], prices=prices), thresholds=Thresholds(), now=NOW)
        series.append(
            {
                (s.name, tuple(sorted(s.labels.items())))
                for f in fams
                for s in f.samples
                if f.name != "gpuwarden_gpu_job_info" and "gpu_uuid" in s.labels
            }
        )
        (info,) = by_name(fams)["gpuwarden_gpu_job_info"].samples
        assert info.labels["job_id"] == job and info.labels["gpu_uuid"] == "GPU-j"
    assert len(series[0]) >= 20  # every per-GPU family reported something
    assert series[0] == series[1]
    labels = {k for _, ls in series[0] for k, _ in ls}
    assert not labels & {"job_id", "user", "team", "project"}
