"""Which earlier run a job's run is compared with (issue 46), and why a pair is not compared.

A later run is paired with the run of its work key that ended last before it started, within
the horizon; the pair is compared only where the work evidently stayed the same: the same GPU
count and model, the same script hash and container image where both runs say one, progress in
the same unit, and, for runs that report no progress (the whole run is the unit), a length
inside the key's usual spread (widened downwards by what the earlier run's fixes could save).

Pure: runs in, a pair and a reason out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from service.core.work_key import WorkKey


@dataclass(frozen=True, slots=True)
class Run:
    """One run of a work key: its shape, times, held GPU-seconds and progress (``units`` None
    where it reported none; ``unit`` the progress unit)."""

    job_id: str
    key: WorkKey
    started_at: datetime
    ended_at: datetime | None
    gpu_seconds: float
    units: float | None = None
    unit: str | None = None

    @property
    def per_unit(self) -> float:
        """GPU-seconds per unit of work: per unit of progress, else the whole run's."""
        if self.units is not None and self.units > 0:
            return self.gpu_seconds / self.units
        return self.gpu_seconds


@dataclass(frozen=True, slots=True)
class MatchRules:
    """How runs are paired: the horizon, and how far a progress-less run may stray from the
    key's usual length (a share of it) before it counts as other work."""

    horizon: timedelta = timedelta(days=30)
    length_tolerance: float = 0.25


@dataclass(frozen=True, slots=True)
class Pair:
    """A later run, the earlier run it is paired with, the key's runs up to that one (for its
    run-to-run noise) and why it is not compared (None: compared)."""

    before: Run
    after: Run
    history: tuple[Run, ...]
    reason: str | None

    @property
    def unit(self) -> str:
        """``progress`` where both runs counted progress, else ``run`` (a fixed-size job)."""
        return "progress" if _has_progress(self.before) and _has_progress(self.after) else "run"


def _has_progress(run: Run) -> bool:
    return run.units is not None and run.units > 0


def previous_run(runs: Sequence[Run], later: Run, rules: MatchRules) -> Run | None:
    """The run of ``later``'s key that ended last at or before ``later`` started, within the
    horizon; None if there is none."""
    best: Run | None = None
    for run in runs:
        if run.job_id == later.job_id or run.key.key != later.key.key or run.ended_at is None:
            continue
        if run.ended_at > later.started_at or later.started_at - run.ended_at > rules.horizon:
            continue
        if best is None or (run.ended_at, run.started_at) > (best.ended_at or run.ended_at,
                                                              best.started_at):  # fmt: skip
            best = run
    return best


def _shape_reason(before: Run, after: Run) -> str | None:
    """Why the two runs' shapes say the work changed, or None."""
    b, a = before.key, after.key
    if b.gpu_count != a.gpu_count:
        return f"other GPU count ({b.gpu_count} before, {a.gpu_count} after)"
    if b.gpu_model != a.gpu_model:
        return f"other GPU model ({b.gpu_model} before, {a.gpu_model} after)"
    if b.script_sha256 and a.script_sha256 and b.script_sha256 != a.script_sha256:
        return "different script hash"
    if b.image and a.image and b.image != a.image:
        return f"different container image ({b.image} before, {a.image} after)"
    return None


def _unit_reason(before: Run, after: Run) -> str | None:
    """Why the runs' units of work do not compare, or None."""
    if _has_progress(before) != _has_progress(after):
        which = "earlier" if _has_progress(before) else "later"
        return f"only the {which} run reported progress"
    if _has_progress(before) and before.unit != after.unit:
        return f"progress in other units ({before.unit} before, {after.unit} after)"
    return None


def _length_reason(
    history: Sequence[Run], after: Run, max_saving_fraction: float, rules: MatchRules
) -> str | None:
    """Why a progress-less run's length says it did other work, or None: longer than the
    key's longest run by more than the tolerance, or shorter than its shortest less all the
    earlier run's fixes could save, by more than the tolerance."""
    lengths = [r.gpu_seconds for r in history]
    low, high = min(lengths), max(lengths)
    tol = rules.length_tolerance
    floor = low * (1 - min(max(max_saving_fraction, 0.0), 1.0)) * (1 - tol)
    if after.gpu_seconds > high * (1 + tol) or after.gpu_seconds < floor:
        return (
            f"duration outside the key's usual spread ({after.gpu_seconds / 3600:.2f} GPU-h; "
            f"usual {low / 3600:.2f}-{high / 3600:.2f} GPU-h) and no progress reported"
        )
    return None


def pair_of(
    runs: Sequence[Run], later: Run, rules: MatchRules, max_saving_fraction: float = 1.0
) -> Pair | None:
    """The pair of ``later`` and the earlier run it is compared with (None: no earlier run of
    its key in the horizon), with why it is not compared; ``max_saving_fraction`` is the
    share of the earlier run its fixes could save (its waste over its cost)."""
    before = previous_run(runs, later, rules)
    if before is None:
        return None
    history = tuple(
        sorted(
            (r for r in runs if r.key.key == before.key.key and r.ended_at is not None
             and r.ended_at <= before.ended_at  # type: ignore[operator]
             and _shape_reason(r, before) is None and _unit_reason(r, before) is None),
            key=lambda r: (r.started_at, r.job_id),
        )
    )  # fmt: skip
    reason = None
    if later.ended_at is None:
        reason = "the later run has not ended"
    reason = reason or _shape_reason(before, later) or _unit_reason(before, later)
    if reason is None and not _has_progress(later):
        reason = _length_reason(history or (before,), later, max_saving_fraction, rules)
    return Pair(before=before, after=later, history=history or (before,), reason=reason)


def noise_fraction(history: Sequence[Run], floor: float) -> float:
    """The key's run-to-run noise: the spread of its runs' GPU-seconds per unit over their
    median ((max - min) / median), at least ``floor`` (one pair's measuring noise)."""
    values = sorted(r.per_unit for r in history if r.per_unit > 0)
    if len(values) < 2:
        return floor
    mid = len(values) // 2
    median = values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
    return max(floor, (values[-1] - values[0]) / median)
