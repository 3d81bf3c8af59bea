"""Which later run a run told a fix is compared with (issue 46), and why a pair is not compared.

A run told a fix is matched to the later runs of its work key (those that started after it
ended, within the horizon), first to last: it is compared with the **first** of them whose work
did not change, and the later runs before that one are shown as not compared, each with its
reason. The run-to-run noise is the spread of the key's runs up to the told one (the runs before
the fix). The pair is compared only where the work evidently stayed the same: the same GPU
count and model, the same script hash and container image where both runs say one, progress in
the same unit, and, for runs that report no progress (the whole run is the unit), a length
inside the key's usual spread (widened downwards by what the earlier run's fixes could save).

Pure: runs in, a pair and a reason out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


NOT_ENDED = "the later run has not ended"


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

    @property
    def same_work_so_far(self) -> bool:
        """Whether nothing says the work changed: compared, or a running later run of the same
        shape (its fix can be read from its shares so far)."""
        return self.reason is None or self.reason == NOT_ENDED


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


def _history(runs: Sequence[Run], before: Run) -> tuple[Run, ...]:
    """The key's runs up to ``before`` of its shape and unit (its run-to-run noise), at least
    ``before`` itself."""
    history = tuple(
        sorted(
            (r for r in runs if r.key.key == before.key.key and r.ended_at is not None
             and before.ended_at is not None and r.ended_at <= before.ended_at
             and _shape_reason(r, before) is None and _unit_reason(r, before) is None),
            key=lambda r: (r.started_at, r.job_id),
        )
    )  # fmt: skip
    return history or (before,)


def compare(
    runs: Sequence[Run],
    before: Run,
    later: Run,
    rules: MatchRules,
    max_saving_fraction: float,
    history: tuple[Run, ...] | None = None,
) -> Pair:
    """The pair of ``before`` and ``later`` with the key's runs up to ``before`` (its noise;
    ``history`` where the caller has it) and why it is not compared (None: compared);
    ``max_saving_fraction`` is the share of the earlier run its fixes could save."""
    history = history if history is not None else _history(runs, before)
    reason = _shape_reason(before, later) or _unit_reason(before, later)
    if reason is None and later.ended_at is None:
        reason = NOT_ENDED
    if reason is None and not _has_progress(later):
        reason = _length_reason(history, later, max_saving_fraction, rules)
    return Pair(before=before, after=later, history=history, reason=reason)


def pair_of(
    runs: Sequence[Run], later: Run, rules: MatchRules, max_saving_fraction: float = 1.0
) -> Pair | None:
    """The pair of ``later`` and the run of its key just before it (None: none in the horizon),
    with why it is not compared: the match where every run is told a fix."""
    before = previous_run(runs, later, rules)
    return None if before is None else compare(runs, before, later, rules, max_saving_fraction)


def _later_runs(runs: Sequence[Run], told: Run, rules: MatchRules) -> list[Run]:
    """The runs of ``told``'s key that started after it ended, within the horizon, in order."""
    if told.ended_at is None:
        return []
    end = told.ended_at
    return sorted(
        (r for r in runs if r.job_id != told.job_id and r.key.key == told.key.key
         and end <= r.started_at and r.started_at - end <= rules.horizon),
        key=lambda r: (r.started_at, r.job_id),
    )  # fmt: skip


def matches(
    runs: Sequence[Run], told: Run, rules: MatchRules, max_saving_fraction: float
) -> list[Pair]:
    """The later runs of a run told a fix, in order, up to and including the first whose work
    did not change (the one it is compared with; the others carry their reason)."""
    history = _history(runs, told)
    out = []
    for later in _later_runs(runs, told, rules):
        pair = compare(runs, told, later, rules, max_saving_fraction, history)
        out.append(pair)
        if pair.reason is None:
            break
    return out


def _taken(
    runs: Sequence[Run],
    before: Run,
    between: Sequence[Run],
    rules: MatchRules,
    fraction: float,
    history: tuple[Run, ...],
) -> bool:
    """Whether one of the runs ``between`` is compared with ``before`` (so takes it)."""
    return any(compare(runs, before, r, rules, fraction, history).reason is None for r in between)


def match_of(
    runs: Sequence[Run],
    later: Run,
    rules: MatchRules,
    told: Callable[[Run], float | None],
) -> Pair | None:
    """The pair ``later`` is shown with: of the earlier runs of its key told a fix (``told``
    gives a run's max saving fraction, None where it was told none; asked only of runs no run
    in between already takes, as it may cost a job summary) whose later runs it is among up to
    their first unchanged one (``matches``), the latest it is compared with, else the latest
    with why they are not compared, else None."""
    mine = [r for r in runs if r.key.key == later.key.key]
    order = (later.started_at, later.job_id)
    candidates = sorted(
        (r for r in mine if r.job_id != later.job_id and r.ended_at is not None
         and r.ended_at <= later.started_at and later.started_at - r.ended_at <= rules.horizon),
        key=lambda r: (r.ended_at, r.started_at, r.job_id),
        reverse=True,
    )  # fmt: skip
    shown: Pair | None = None
    for before in candidates:
        history = _history(mine, before)
        between = [r for r in _later_runs(mine, before, rules) if (r.started_at, r.job_id) < order]

        # Taken even at the strictest length rule (no saving): no need to ask if it was told.
        if _taken(mine, before, between, rules, 0.0, history):
            continue
        fraction = told(before)
        if fraction is None or _taken(mine, before, between, rules, fraction, history):
            continue
        pair = compare(mine, before, later, rules, fraction, history)
        if pair.reason is None:
            return pair
        shown = shown or pair
    return shown


def noise_fraction(history: Sequence[Run], floor: float) -> float:
    """The key's run-to-run noise: the spread of its runs' GPU-seconds per unit over their
    median ((max - min) / median), at least ``floor`` (one pair's measuring noise)."""
    values = sorted(r.per_unit for r in history if r.per_unit > 0)
    if len(values) < 2:
        return floor
    mid = len(values) // 2
    median = values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
    return max(floor, (values[-1] - values[0]) / median)
