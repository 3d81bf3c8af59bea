"""``bench/progress_frameworks.py --dry-run`` (issue 46): it serves a real central, and the
reporter-only check reads back the steps it sent; frameworks missing here are skipped and named
(the script runs them where torch, lightning and transformers are installed)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_dry_run_reads_back_the_steps_sent() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "progress_frameworks.py"), "--dry-run", "--steps",
         "12"],
        env=env, capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "reporter only (no framework): trained 12 steps; central reports 12.0 (same" in done.stdout
    )
    if importlib.util.find_spec("torch") is None:
        assert "plain PyTorch + ProgressReporter: SKIPPED (torch not importable)" in done.stdout
