"""The shipped dcgm-exporter counters file turns on what stock dcgm-exporter leaves off."""

from __future__ import annotations

from pathlib import Path

from service.vocabulary import DCGM_FIELDS

REPO = Path(__file__).resolve().parents[2]
OURS = REPO / "deploy" / "dcgm-exporter" / "gpuwarden-counters.csv"
NVIDIA_DEFAULT = REPO / "tests" / "data" / "dcgm-exporter" / "default-counters.csv"
TYPES = {"gauge", "counter", "label"}


def enabled(path: Path) -> dict[str, str]:
    """Field -> Prometheus type of every line dcgm-exporter would load (its CSV format)."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        field, kind, help_text = (p.strip() for p in line.split(",", 2))
        assert field.startswith("DCGM_FI_") and kind in TYPES and help_text, line
        out[field] = kind
    return out


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
