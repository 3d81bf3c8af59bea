"""dcgm-exporter with several pods on one GPU: each pod's own value where the exporter gives
one, and a plain warning when it repeats the GPU's value for every pod (dcgm-exporter#587)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import httpx
import pytest

from service.collectors.dcgm_exporter import DcgmExporterBackend, parse_exposition, pod_shares

UUID = "GPU-585834da-79ca-0599-5140-4ffdb131ae93"


def _line(pod: str, value: float, field: str = "DCGM_FI_PROF_GR_ENGINE_ACTIVE") -> str:
    # The label set of tests/data/dcgm-exporter/l40s-k8s.prom, one series per pod.
    return (
        f'{field}{{gpu="0",UUID="{UUID}",pci_bus_id="00000000:4E:00.0",device="nvidia0",'
        f'modelName="NVIDIA L40S",Hostname="l40s.example.com",container="c",'
        f'namespace="ml",pod="{pod}"}} {value:.6f}'
    )


def _text(*lines: str) -> str:
    return "# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n" + "\n".join(lines) + "\n"


def test_per_pod_values_become_each_pods_share() -> None:
    exp = parse_exposition(_text(_line("train-0", 0.62), _line("notebook-0", 0.0)))
    by_job = {p.job_id: p.sm_util for p in exp.jobs}
    assert by_job == {"k8s:ml/train-0": pytest.approx(0.62), "k8s:ml/notebook-0": 0.0}
    assert exp.repeated == []
    (reading,) = exp.readings
    assert reading.metrics["gr_engine_active"] == pytest.approx(0.62)  # the pods' sum


def test_repeated_gpu_value_is_said_plainly(caplog: pytest.LogCaptureFixture) -> None:
    text = _text(_line("train-0", 0.41), _line("notebook-0", 0.41))
    exp = parse_exposition(text)
    assert exp.repeated == [UUID]
    assert {p.sm_util for p in exp.jobs} == {None}  # not told apart: no per-pod share
    client = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(200, text=text)))
    backend = DcgmExporterBackend(url="http://dcgm.test/metrics", client=client)
    with caplog.at_level(logging.WARNING):
        backend.sample(datetime(2026, 12, 3, tzinfo=UTC))
        backend.sample(datetime(2026, 12, 3, tzinfo=UTC))
    said = [r for r in caplog.records if "cannot be told apart" in r.getMessage()]
    assert len(said) == 1 and UUID in said[0].getMessage()


def test_one_pod_keeps_the_gpu_value() -> None:
    exp = parse_exposition(_text(_line("train-0", 0.3)))
    assert [p.sm_util for p in exp.jobs] == [None]
    assert exp.readings[0].metrics["gr_engine_active"] == pytest.approx(0.3)


@pytest.mark.parametrize(
    ("values", "shares", "repeated"),
    [
        ({"a": {"sm_active": 0.5}, "b": {"sm_active": 0.1}}, {"a": 0.5, "b": 0.1}, False),
        ({"a": {"sm_active": 0.5}, "b": {"sm_active": 0.5}}, None, True),
        ({"a": {"gpu_util": 0.9}, "b": {"sm_active": 0.1}}, None, False),  # no common rung
        (
            {"a": {"sm_active": 0.2, "gpu_util": 1.0}, "b": {"sm_active": 0.0}},
            {"a": 0.2, "b": 0.0},
            False,
        ),
    ],
)
def test_pod_shares(values, shares, repeated) -> None:
    assert pod_shares(values) == (shares, repeated)


def test_pods_time_slicing_one_mig_instance_are_each_its_tenant() -> None:
    # The label set of tests/data/dcgm-exporter/h100-mig-kserve.prom (instance 7), one series
    # per pod as --kubernetes-virtual-gpus writes it for MIG-<uuid>::<n> replicas.
    parent = "GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77"
    lines = [
        f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu="0",UUID="{parent}",pci_bus_id="00000000:1A:00.0",'
        f'device="nvidia0",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="1g.10gb",GPU_I_ID="7",'
        f'Hostname="gsrh100-074",container="c",namespace="ml",pod="{pod}",vgpu="{n}"}} 0.250000'
        for n, pod in enumerate(("embed-0", "tts-0"))
    ]
    exp = parse_exposition(_text(*lines))
    (instance,) = exp.devices
    assert instance.mig_parent_uuid == parent
    assert {(p.gpu_uuid, p.pid, p.job_id) for p in exp.jobs} == {
        (instance.uuid, 0, "k8s:ml/embed-0"),
        (instance.uuid, 0, "k8s:ml/tts-0"),
    }
    assert exp.repeated == [instance.uuid]  # the instance's value, twice: not told apart
