"""The realised savings of the recorded pairs beside the ones their own timers measured and the
promises: reads OUT_DIR/savings_runs.json, writes OUT_DIR/savings_result.json, prints a table.

    python3 docs/gpu-check/savings/savings_compare.py docs/gpu-check/savings

For each pair (wasteful run, then the same job key with the fix):
- measured: 1 - (after / before) of the runs' own time per unit of work (seconds per step from
  their own timers; for the fixed-size pair, the run's wall time);
- realised: 1 - (GPU-seconds per unit after / before) from what the central recorded (its
  ``gpu_seconds_per_unit``: held GPU-seconds over the units of progress reported; for the
  fixed-size pair the held GPU-seconds of the whole run), the contract's definition;
- promised: what the wasteful job's page promised for the cause's fix, as a fraction of the unit
  of work: for progress pairs the fix's ``saving_fraction`` (of the cause's time, which the
  steps run in), for the fixed-size pair its ``saving_usd`` over the whole run's cost.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def realised_fraction(before: dict[str, Any], after: dict[str, Any]) -> float | None:
    """1 - GPU-seconds per unit of work after / before, from two job pages (the contract's
    definition; h-savings' ``savings.realised_fraction`` replaces it once merged)."""
    if before.get("gpu_seconds_per_unit") and after.get("gpu_seconds_per_unit"):
        return 1.0 - after["gpu_seconds_per_unit"] / before["gpu_seconds_per_unit"]
    if before.get("unit_of_work") == "run" and after.get("unit_of_work") == "run":
        # held_seconds is the job's GPU-seconds (summed over its GPUs)
        return 1.0 - after["summary"]["held_seconds"] / before["summary"]["held_seconds"]
    return None


def promised_fraction(before: dict[str, Any], cause: str, unit: str) -> float | None:
    """What the wasteful job was promised by its cause's fix, as a fraction of its unit."""
    fixes = [f for f in before.get("recommendations") or [] if f.get("cause") == cause]
    if not fixes:
        return None
    if unit == "run":
        return float(fixes[0]["saving_usd"]) / float(before["summary"]["cost_usd"])
    return float(fixes[0]["saving_fraction"])


def compare(runs: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per pair."""
    by = {(r["pair"], r["phase"]): r for r in runs["runs"]}
    rows = []
    for (pair, phase), b in by.items():
        if phase != "before" or (pair, "after") not in by:
            continue
        a = by[(pair, "after")]
        unit = "run" if b["kind"] == "fixed" else "step"
        key = "seconds_per_run" if unit == "run" else "seconds_per_step"
        own_b, own_a = b.get(key), a.get(key)
        jb, ja = runs["jobs"][b["job"]], runs["jobs"][a["job"]]
        top = (jb.get("recommendations") or [{}])[0]
        rows.append(
            {
                "pair": pair,
                "cause": b["cause"],
                "unit": unit,
                "own_before": own_b,
                "own_after": own_a,
                "measured": 1.0 - own_a / own_b if own_a and own_b else None,
                "realised": realised_fraction(jb, ja),
                "promised": promised_fraction(jb, b["cause"], unit),
                "named_top_fix": top.get("cause"),
                "gpu_seconds_per_unit_before": jb.get("gpu_seconds_per_unit"),
                "gpu_seconds_per_unit_after": ja.get("gpu_seconds_per_unit"),
                "held_seconds": [jb["summary"]["held_seconds"], ja["summary"]["held_seconds"]],
            }
        )
    return rows


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    runs = json.loads((out / "savings_runs.json").read_text())
    rows = compare(runs)
    (out / "savings_result.json").write_text(json.dumps({"pairs": rows}, indent=1))

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f}%"

    print(f"{'pair':<24} {'unit':<5} {'own before -> after':>22} {'measured':>9} "
          f"{'realised':>9} {'promised':>9}  top fix")  # fmt: skip
    for r in rows:
        own = f"{r['own_before'] or 0:.4f} -> {r['own_after'] or 0:.4f}"
        print(f"{r['pair']:<24} {r['unit']:<5} {own:>22} {pct(r['measured']):>9} "
              f"{pct(r['realised']):>9} {pct(r['promised']):>9}  {r['named_top_fix']}")  # fmt: skip


if __name__ == "__main__":
    main()
