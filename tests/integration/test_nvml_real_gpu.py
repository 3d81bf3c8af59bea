"""The NVML backend on a real NVIDIA GPU (deselected by default; run with ``-m gpu``)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from service.collectors.nvml import NvmlBackend, gpu_present

pytestmark = pytest.mark.gpu


def test_every_gpu_reports_memory_power_and_activity_within_range():
    assert gpu_present(), "this test needs an NVIDIA GPU"
    b = NvmlBackend()
    try:
        devices = b.devices()
        assert devices and all(d.uuid.startswith(("GPU-", "MIG-")) for d in devices)
        b.sample(datetime.now(UTC))  # primes GPM
        time.sleep(0.5)
        snap = b.sample(datetime.now(UTC))
        assert len(snap.readings) == len(devices)
        for r in snap.readings:
            m = r.metrics
            assert m["fb_total_bytes"] > 0 and 0 <= m["fb_used_bytes"] <= m["fb_total_bytes"]
            for k in ("sm_active", "tensor_active", "dram_active", "gpu_util"):
                if k in m:
                    assert 0.0 <= m[k] <= 1.0
    finally:
        b.close()
