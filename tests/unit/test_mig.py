"""MIG instances: one identity across backends, retirement on reconfiguration, slice prices."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

import service.collectors.nvml as nvml_mod
from service.collectors.dcgm_exporter import DcgmExporterBackend, parse_exposition
from service.collectors.mig import MigIdentities
from service.collectors.nvml import NvmlBackend
from service.costs.prices import PriceRow, price_at, price_lookup
from tests.fake_nvml import FakeGpu, FakeNvml

DATA = Path(__file__).resolve().parents[1] / "data" / "dcgm-exporter"
H100 = "GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77"  # the parent in h100-mig-kserve.prom
T0 = datetime(2026, 12, 3, 8, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture(autouse=True)
def no_gpm_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml_mod, "GPM_MIN_INTERVAL_SECONDS", 0.0)


def mig(gi: int, profile: str = "1g.10gb") -> FakeGpu:
    return FakeGpu(
        f"MIG-6c5b{gi:04d}-aaaa-bbbb-cccc-000000000000",
        name=f"NVIDIA H100 80GB HBM3 MIG {profile}",
        gpu_instance_id=gi,
        total=10 * 1024**3,
    )


def h100(*migs: FakeGpu) -> FakeGpu:
    return FakeGpu(H100, name="NVIDIA H100 80GB HBM3", migs=list(migs))


def test_nvml_and_dcgm_exporter_name_an_instance_alike(tmp_path: Path):
    ids = MigIdentities(tmp_path / "mig.json", clock=Clock())
    nvml = NvmlBackend(lib=FakeNvml([h100(mig(7), mig(8), mig(9))]), mig=ids)
    nvml_ids = {d.uuid for d in nvml.devices()}
    exp = parse_exposition((DATA / "h100-mig-kserve.prom").read_text(), ids)
    assert {d.uuid for d in exp.devices} == nvml_ids
    assert f"MIG-{H100}/7/1g.10gb@20261203T080000Z" in nvml_ids
    # NVML's own MIG-<uuid> stays known as the alias (the device plugin's name for it).
    assert {d.alias for d in nvml.devices()} == {m.uuid for m in h100(mig(7), mig(8), mig(9)).migs}
    assert {d.model for d in nvml.devices()} == {"NVIDIA H100 80GB HBM3 MIG 1g.10gb"}
    assert {(d.pci_bus_id, d.driver_version) for d in nvml.devices()} == {
        ("00000000:1A:00.0", "570.124.06")
    }
    # A restart (or a switch of backend) reads the same identities back from the state file.
    again = MigIdentities(tmp_path / "mig.json", clock=lambda: T0 + timedelta(days=3))
    assert {
        d.uuid for d in parse_exposition((DATA / "h100-mig-kserve.prom").read_text(), again).devices
    } == nvml_ids


def test_nvml_reconfiguration_retires_and_reused_ids_get_new_identities():
    clock = Clock()
    gpu = h100(mig(7), mig(8))
    lib = FakeNvml([gpu])
    b = NvmlBackend(lib=lib, mig=MigIdentities(clock=clock), mig_rescan_cycles=1)
    before = {d.uuid for d in b.devices()}
    b.sample(T0)
    # The admin destroys instance 8 and creates a 2g.20gb on the same GPU instance id.
    clock.now = T0 + timedelta(hours=1)
    gpu.migs = [mig(7), mig(8, "2g.20gb")]
    b.sample(T0 + timedelta(hours=1))
    devs = {d.uuid: d for d in b.devices()}
    old = f"MIG-{H100}/8/1g.10gb@20261203T080000Z"
    assert devs[old].retired and not devs[old].lost
    assert f"MIG-{H100}/8/2g.20gb@20261203T090000Z" in devs
    assert f"MIG-{H100}/7/1g.10gb@20261203T080000Z" in devs and before & set(devs) == before
    # Destroyed and re-created in the same shape later: a new instance, a new identity.
    gpu.migs = [mig(7)]
    b.sample(T0 + timedelta(hours=2))
    clock.now = T0 + timedelta(hours=3)
    gpu.migs = [mig(7), mig(8, "2g.20gb")]
    b.sample(T0 + timedelta(hours=3))
    assert f"MIG-{H100}/8/2g.20gb@20261203T110000Z" in {d.uuid for d in b.devices()}
    # A parent that falls off the bus is lost, not a reconfiguration.
    gpu.lost = True
    b.sample(T0 + timedelta(hours=4))
    assert not any(d.retired for d in b.devices())


def test_dcgm_exporter_retires_a_destroyed_instance_while_the_parent_reports():
    full = (DATA / "h100-mig-kserve.prom").read_text()
    without_8 = "\n".join(line for line in full.splitlines() if 'GPU_I_ID="8"' not in line)
    pages = [full, without_8] + [without_8] * 8
    client = httpx.Client(
        transport=httpx.MockTransport(lambda r: httpx.Response(200, text=pages.pop(0)))
    )
    b = DcgmExporterBackend(
        url="http://exporter:9400/metrics", client=client, mig=MigIdentities(clock=Clock())
    )
    b.sample(T0)
    b.sample(T0 + timedelta(seconds=30))
    gone = f"MIG-{H100}/8/1g.10gb@20261203T080000Z"
    devs = {d.uuid: d for d in b.devices()}
    assert devs[gone].retired and not devs[gone].lost
    assert sum(d.retired for d in devs.values()) == 1 and len(devs) == 3
    for k in range(8):  # listed a few scrapes so a shipped batch carries it, then forgotten
        b.sample(T0 + timedelta(seconds=60 + 30 * k))
    assert gone not in {d.uuid for d in b.devices()} and len(b.devices()) == 2


NEW_YEAR = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_slice_costs_its_share_of_the_parent_unless_its_profile_is_priced():
    rows = [PriceRow("*H100*", 4.0, NEW_YEAR), PriceRow("*A30*", 1.2, NEW_YEAR)]
    when = T0
    slice_1g = "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    assert price_at(rows, "NVIDIA H100 80GB HBM3", when).usd_per_gpu_hour == 4.0  # type: ignore[union-attr]
    assert price_at(rows, slice_1g, when).usd_per_gpu_hour == pytest.approx(4.0 / 7)  # type: ignore[union-attr]
    assert price_at(
        rows, "NVIDIA H100 80GB HBM3 MIG 3g.40gb", when
    ).usd_per_gpu_hour == pytest.approx(12.0 / 7)  # type: ignore[union-attr]
    assert price_at(rows, "NVIDIA A30 MIG 2g.12gb", when).usd_per_gpu_hour == pytest.approx(0.6)  # type: ignore[union-attr]
    assert price_lookup(rows)(slice_1g, when).usd_per_gpu_hour == pytest.approx(4.0 / 7)  # type: ignore[union-attr]
    named = [*rows, PriceRow("*1g.10gb*", 0.9, NEW_YEAR)]
    assert price_at(named, slice_1g, when).usd_per_gpu_hour == 0.9  # type: ignore[union-attr]
    assert price_at([PriceRow("*A100*", 2.0, NEW_YEAR)], slice_1g, when) is None  # never $0
