"""The shipped default price table (on-demand USD per GPU-hour), used until one is configured.

Figures are approximate public on-demand list prices per GPU (instance price / GPUs per
instance), as published around 2025; see docs/costs.md for the sources and caveats.
"""

from __future__ import annotations

from datetime import UTC, datetime

from service.costs.prices import PriceRow

_FROM = datetime(2025, 1, 1, tzinfo=UTC)

DEFAULT_PRICES: tuple[PriceRow, ...] = (
    PriceRow(
        "*A100*40GB*", 4.10, _FROM, "AWS p4d.24xlarge on-demand $32.77/h / 8 GPUs (us-east-1)"
    ),
    PriceRow(
        "*A100*80GB*", 5.12, _FROM, "AWS p4de.24xlarge on-demand $40.97/h / 8 GPUs (us-east-1)"
    ),
    PriceRow(
        "*H100*",
        6.88,
        _FROM,
        "AWS p5.48xlarge on-demand ~$55.04/h / 8 GPUs after the June 2025 cut",
    ),
    PriceRow(
        "*H200*", 10.60, _FROM, "Azure ND96isr H200 v5 on-demand ~$84.80/h / 8 GPUs (East US)"
    ),
    PriceRow("*L4", 0.80, _FROM, "AWS g6.xlarge on-demand $0.805/h, 1 GPU (us-east-1)"),
    PriceRow("*L40S*", 1.86, _FROM, "AWS g6e.xlarge on-demand $1.861/h, 1 GPU (us-east-1)"),
    PriceRow("*B200*", 14.24, _FROM, "AWS p6-b200.48xlarge on-demand ~$113.93/h / 8 GPUs"),
)

# Model names as NVML reports them, so a pattern can be checked before any such GPU reports in.
KNOWN_MODEL_NAMES: tuple[str, ...] = (
    "NVIDIA A100-SXM4-40GB",
    "NVIDIA A100-PCIE-40GB",
    "NVIDIA A100-SXM4-80GB",
    "NVIDIA A100 80GB PCIe",
    "NVIDIA A10",
    "NVIDIA A10G",
    "NVIDIA A30",
    "NVIDIA A40",
    "NVIDIA H100 80GB HBM3",
    "NVIDIA H100 PCIe",
    "NVIDIA H100 NVL",
    "NVIDIA H200",
    "NVIDIA H200 NVL",
    "NVIDIA GH200 480GB",
    "NVIDIA L4",
    "NVIDIA L40",
    "NVIDIA L40S",
    "NVIDIA B200",
    "NVIDIA B100",
    "NVIDIA GB200",
    "Tesla V100-SXM2-16GB",
    "Tesla V100-SXM2-32GB",
    "Tesla T4",
)
