"""The dcgm-exporter parser on real exporters' output (tests/data/dcgm-exporter, sources inside)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from service.collectors.dcgm_exporter import Exposition, parse_exposition
from service.vocabulary import ActivitySource

DATA = Path(__file__).resolve().parents[1] / "data" / "dcgm-exporter"


def capture(name: str) -> str:
    return (DATA / name).read_text()


def parsed(name: str) -> Exposition:
    return parse_exposition(capture(name))


def metrics(exp: Exposition) -> dict[str, dict[str, float]]:
    return {r.uuid: r.metrics for r in exp.readings}


def jobs(exp: Exposition) -> dict[str, str]:
    return {p.gpu_uuid: p.job_id for p in exp.jobs if p.job_id}


def test_every_capture_names_its_source_and_parses():
    files = sorted(DATA.glob("*.prom"))
    assert len(files) >= 8
    for f in files:
        assert "source:" in f.read_text().splitlines()[0], f.name
        assert parse_exposition(f.read_text()).devices, f.name


def test_h100_mig_instances_have_engine_activity_parents_and_pods():
    exp = parsed("h100-mig-kserve.prom")
    parent = "GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77"
    assert exp.hostname == "gsrh100-074"
    assert len(exp.devices) == 3
    assert {d.mig_parent_uuid for d in exp.devices} == {parent}
    assert all("1g.10gb" in d.model for d in exp.devices)
    # GR_ENGINE_ACTIVE is the activity DCGM gives a MIG instance: 0.0 is a value, not absence.
    assert all(m == {"gr_engine_active": 0.0} for m in metrics(exp).values())
    assert {r.source for r in exp.readings} == {ActivitySource.DCGM}
    assert sorted(jobs(exp).values()) == [
        "k8s:model-playground-stg/text-embedding-predictor-00008-deployment-57946f6c67-vdtjl",
        "k8s:model-playground-stg/tts-predictor-00011-deployment-5554f75554-8j8pl",
    ]


def test_a30_instances_of_two_parents_stay_apart():
    exp = parsed("a30-mig-dram.prom")
    assert len({d.uuid for d in exp.devices}) == 6
    parents = [d.mig_parent_uuid for d in exp.devices]
    assert parents.count("GPU-265c9814-6156-355b-e589-ff2064894f16") == 4
    assert parents.count("GPU-2d20791a-b4a6-ba59-97f1-e95b99fe5b49") == 2
    assert all(m == {"dram_active": 0.0} for m in metrics(exp).values())


def test_a30_instance_activity_and_pod():
    exp = parsed("a30-mig-pod.prom")
    (dev,) = exp.devices
    assert metrics(exp)[dev.uuid]["gr_engine_active"] == pytest.approx(0.959228)
    assert jobs(exp) == {dev.uuid: "k8s:gi-user1-giops-ai/testest-9sxmd"}


def test_l40s_pods_and_an_unallocated_gpu():
    exp = parsed("l40s-k8s.prom")
    assert exp.hostname == "l40s.example.com"
    assert [d.index for d in exp.devices] == [0, 1, 2]
    assert jobs(exp) == {
        "GPU-585834da-79ca-0599-5140-4ffdb131ae93": "k8s:redacted/tensorflow-0",
        "GPU-8f8001ff-73ba-2e83-3cdc-4156ae4f3912": "k8s:redacted/tensorflow-0",
    }


def test_v100_default_counters_health_and_duty_cycle():
    exp = parsed("v100-default-counters.prom")
    m = metrics(exp)
    assert exp.hostname == "r6i3n0"
    assert {u: v["pcie_replays"] for u, v in m.items()} == {
        "GPU-a6158b59-2c1e-1e63-0068-9178c4298abd": 0.0,
        "GPU-8d5053b3-9280-7d1a-751b-4fd2fdd547c5": 0.0,
        "GPU-a9079f15-493e-6c1c-c78c-73ec2b840cba": 0.0,
        "GPU-bd94f0f5-8c2f-bc95-74ad-5f99fdc33d01": 0.0,
    }
    assert m["GPU-a6158b59-2c1e-1e63-0068-9178c4298abd"]["gpu_util"] == 0.0
    assert {r.source for r in exp.readings} == {ActivitySource.NVML}  # no profiling fields
    assert exp.jobs == []


def test_lower_case_hostname_label_and_a_mig_pod():
    exp = parsed("mixed-node-lowercase-hostname.prom")
    assert exp.hostname == "dcgm-exporter-wwwjh"
    mig = next(d for d in exp.devices if d.mig_parent_uuid)
    assert "1g.6gb" in mig.model
    assert jobs(exp) == {mig.uuid: "k8s:default/triton-server-f7cb5d77-95xcf"}


def test_lower_case_names_uuid_label_and_empty_old_pod_labels():
    exp = parsed("a100-mig-old-labels-lowercase.prom")
    assert len(exp.devices) == 3
    assert all(m == {"gr_engine_active": 0.0} for m in metrics(exp).values())
    assert exp.jobs == []  # pod_name="" is no pod


def test_empty_pod_labels_are_no_job():
    exp = parsed("titan-v-empty-pod-labels.prom")
    assert len(exp.devices) == 5 and exp.jobs == []
    assert metrics(exp)["GPU-58fae45b-e5a5-0c62-d478-8ff7c485e74e"]["sm_clock_hz"] == 1.335e9


def test_old_pod_label_spellings_and_pod_uid():
    # The #272 line with its old-spelling pod labels filled, as dcgm-exporter's
    # --kubernetes-use-old-namespace writes them when a pod holds the instance.
    line = capture("a100-mig-old-labels-lowercase.prom").splitlines()[3]
    filled = line.replace('container_name=""', 'container_name="main"')
    filled = filled.replace('pod_name=""', 'pod_name="train-0"')
    filled = filled.replace('pod_namespace=""', 'pod_namespace="ml"')
    assert list(jobs(parse_exposition(filled)).values()) == ["k8s:ml/train-0"]
    uid_only = line.replace('container_name=""', 'pod_uid="0f1e2d3c-aaaa-bbbb-cccc-111122223333"')
    assert list(jobs(parse_exposition(uid_only)).values()) == [
        "k8s:0f1e2d3c-aaaa-bbbb-cccc-111122223333"
    ]


def test_not_supported_sentinels_are_absent_never_values():
    exp = parsed("readme-not-supported.prom")
    (dev,) = exp.devices
    assert metrics(exp)[dev.uuid] == {"sm_clock_hz": 139e6}  # MEMORY_TEMP: not a value
    # The same DCGM_INT64_NOT_SUPPORTED on fields we map, and NVIDIA/DCGM#199's GPU_UTIL glitch
    # (4294967295) on the V100 capture's line: absent, never 9.2e18 C or 42949672.95 of a GPU.
    text = capture("readme-not-supported.prom").replace(
        "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP"
    )
    assert "temperature_celsius" not in metrics(parse_exposition(text))[dev.uuid]
    v100 = capture("v100-default-counters.prom")
    glitch = v100.replace(
        'Hostname="r6i3n0"} 0\n',
        'Hostname="r6i3n0"} 4294967295\n',
    )
    got = metrics(parse_exposition(glitch)).get("GPU-a6158b59-2c1e-1e63-0068-9178c4298abd", {})
    assert "gpu_util" not in got and "pcie_replays" not in got
    for sentinel in ("9223372036854775792", "9223372036854775794", "140737488355330", "2147483634"):
        line = f'DCGM_FI_PROF_SM_ACTIVE{{gpu="0",UUID="GPU-x"}} {sentinel}\n'
        assert metrics(parse_exposition(line)) == {}, sentinel


def test_an_exporter_of_another_node_is_named_in_a_warning(caplog: pytest.LogCaptureFixture):
    import httpx

    from service.collectors.dcgm_exporter import DcgmExporterBackend

    def backend(capture_name: str, node: str) -> DcgmExporterBackend:
        text = capture(capture_name)
        client = httpx.Client(
            transport=httpx.MockTransport(lambda r: httpx.Response(200, text=text))
        )
        return DcgmExporterBackend(url="http://exporter:9400/metrics", client=client, node=node)

    now = datetime(2026, 12, 3, 8, 0, tzinfo=UTC)
    with caplog.at_level("WARNING"):
        backend("l40s-k8s.prom", "l40s").sample(now)  # its own node (short name)
        backend("a30-mig-pod.prom", "gpu-node-9").sample(now)  # Hostname is the pod: says nothing
        assert caplog.records == []
        b = backend("l40s-k8s.prom", "gpu-node-9")
        b.sample(now)
        b.sample(now)
    (warning,) = caplog.records
    assert (
        "'l40s.example.com'" in warning.getMessage()
        and "internalTrafficPolicy" in warning.getMessage()
    )


def test_encoder_and_decoder_utilisation_are_read_as_ratios():
    # The RTX 2000 Ada of this capture decodes at 46% and encodes at 9%: video work that a
    # GPU Warden reading only the SM figures would call idle.
    got = metrics(parsed("mixed-node-lowercase-hostname.prom"))
    ada = got["GPU-fc60126e-514d-3522-2828-c5daa8e99d85"]
    assert ada["dec_util"] == pytest.approx(0.46)
    assert ada["enc_util"] == pytest.approx(0.09)


def test_health_fields_of_dcgm_2_0_are_read() -> None:
    # dcgm-exporter 2.0.13 with DCGM's memory health fields: ECC and retired pages, all 0.
    m = metrics(parsed("dcgm-2.0.13-health-fields.prom"))
    got = m["GPU-8c16e996-bd76-aa91-17e7-b48bcd0208ba"]
    assert {
        k: got[k] for k in ("ecc_dbe_errors", "retired_pages_dbe", "retired_pages_pending")
    } == {
        "ecc_dbe_errors": 0,
        "retired_pages_dbe": 0,
        "retired_pages_pending": 0,
    }
    assert got["fb_used_bytes"] == 1057 * 2**20 and got["pcie_replays"] == 0


def test_clock_throttle_reasons_under_dcgms_old_name_are_read() -> None:
    m = metrics(parsed("t4-clock-throttle-reasons.prom"))
    assert m["GPU-9ef1b6d0-3643-5dd7-b823-c0ec20dcf2d5"]["clocks_event_reasons"] == 1  # idle
