"""The committed pod-resources messages are exactly what protoc generates from the kubelet's
api.proto (service/collectors/kubelet/podresources.proto, copied from upstream unchanged).

Committed rather than generated at build time: the agent's wheel and image then need no protoc,
and a change to the generated code shows in review. This test regenerates both files with
grpcio-tools' protoc (pinned in pyproject.toml) and compares them byte for byte.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from grpc_tools import protoc

from service.collectors.kubelet.podresources import LIST_METHOD

REPO = Path(__file__).resolve().parents[2]
PROTO = Path("service/collectors/kubelet/podresources.proto")


def test_generated_module_matches_the_proto(tmp_path: Path) -> None:
    (tmp_path / PROTO.parent).mkdir(parents=True)
    shutil.copy(REPO / PROTO, tmp_path / PROTO)
    out = str(tmp_path / "out")
    Path(out).mkdir()
    rc = protoc.main(
        [
            "protoc",
            f"-I{tmp_path}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            str(tmp_path / PROTO),
        ]
    )
    assert rc == 0
    for suffix in ("_pb2.py", "_pb2.pyi"):
        name = PROTO.with_name(PROTO.stem + suffix)
        assert (Path(out) / name).read_bytes() == (REPO / name).read_bytes(), name


def test_the_proto_is_the_kubelets_v1_api_with_dra() -> None:
    from service.collectors.kubelet import podresources_pb2 as pb

    service = pb.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    assert f"/{service.full_name}/List" == LIST_METHOD  # what the agent's client calls
    assert {m.name for m in service.methods} >= {"List", "Get", "GetAllocatableResources"}
    fields = pb.ContainerResources.DESCRIPTOR.fields_by_name
    assert fields["dynamic_resources"].number == 5
    claim = pb.ClaimResource.DESCRIPTOR.fields_by_name
    assert (claim["driver_name"].number, claim["device_name"].number) == (2, 4)
