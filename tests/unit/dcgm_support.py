"""The counters files of dcgm-exporter, read as the counters they enable."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
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
