"""The shipped dcgm-exporter counters file turns on what stock dcgm-exporter leaves off."""

from __future__ import annotations

from pathlib import Path

from service.vocabulary import DCGM_FIELDS
from tests.unit.dcgm_support import NVIDIA_DEFAULT, REPO, enabled

OURS = REPO / "deploy" / "dcgm-exporter" / "gpuwarden-counters.csv"


def test_stock_counters_leave_sm_active_off():
    stock = enabled(NVIDIA_DEFAULT)
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in stock
    assert "DCGM_FI_PROF_SM_ACTIVE" not in stock and "DCGM_FI_PROF_SM_OCCUPANCY" not in stock


def test_our_counters_enable_every_field_the_agent_maps():
    ours = enabled(OURS)
    assert {f.name for f in DCGM_FIELDS} <= set(ours)
    assert {"DCGM_FI_DEV_FB_FREE", "DCGM_FI_DRIVER_VERSION"} <= set(ours)
    # Everything NVIDIA enables by default that GPU Warden reads stays on.
    stock = enabled(NVIDIA_DEFAULT)
    assert {f.name for f in DCGM_FIELDS if f.name in stock} <= set(ours)
    for field, kind in ours.items():
        if field in stock:
            assert stock[field] == kind, field


def loaded_lines(path: Path) -> dict[str, tuple[str, str]]:
    """Field -> (type, help) of every line dcgm-exporter would load, spacing normalised."""
    out: dict[str, tuple[str, str]] = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        field, kind, help_text = (p.strip() for p in line.split(",", 2))
        out[field] = (kind, help_text)
    return out


def test_our_counters_are_nvidias_defaults_plus():
    # Loading ours in place of NVIDIA's must not drop a series other dashboards read
    # (ENC_UTIL, DEC_UTIL, NVLINK_BANDWIDTH_TOTAL, VGPU_LICENSE_STATUS ...): every line of
    # the upstream default file is in ours with the same type and help text.
    ours = loaded_lines(OURS)
    stock = loaded_lines(NVIDIA_DEFAULT)
    missing = {f: v for f, v in stock.items() if ours.get(f) != v}
    assert not missing, missing
