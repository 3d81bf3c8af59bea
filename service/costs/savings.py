"""What a fix really saved (issue 46): a run told a fix, the next run of its work, and the
realised saving beside the promise; the ledger's sums and the per-cause calibration.

realised share = 1 - (GPU-seconds per unit after / before); in dollars, the earlier run's
GPU-seconds at the price per GPU-second the later run paid, times that share. A share inside the
key's run-to-run noise is "no measurable change" (no dollars); a saving is never more than the
earlier run's waste (capped, and the reason says so). The fix applied is the advised cause whose
GPU-seconds per unit of work fell (by at least half what it promised); the promise compared is
that fix's.

Pure: figures of two runs in, a saving out.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypedDict

from service.core.matching import Pair, noise_fraction
from service.costs.recommend import Recommendation

Verdict = Literal["saved", "no_measurable_change", "worse", "not_compared"]
VERDICTS: tuple[Verdict, ...] = ("saved", "no_measurable_change", "worse", "not_compared")

# A fix counts as applied where its cause's GPU-seconds per unit of work fell by at least this
# share of what the fix promised (input-starved, promised 91%: 89% -> 3% of the run is applied,
# 40% -> 35% is noise in the mix of causes; bf16, promised 50%, halves a memory-bound step).
APPLIED_SHARE_RATIO = 0.5
CALIBRATION_MIN_PAIRS = 20


@dataclass(frozen=True, slots=True)
class RunMoney:
    """A run's money figures the saving needs: held GPU-seconds, cost and waste (USD, None
    unpriced), each cause's share of its covered time, and the fixes it was told."""

    gpu_seconds: float
    cost_usd: float | None
    waste_usd: float | None
    cause_shares: Mapping[str, float]
    fixes: Sequence[Recommendation] = ()

    def waste_fraction(self) -> float:
        """The share of the run its waste is (what every fix together could save)."""
        if self.cost_usd and self.waste_usd is not None:
            return min(1.0, max(0.0, self.waste_usd / self.cost_usd))
        saved = sum(f.seconds * f.saving_fraction for f in self.fixes if f.kind != "mig")
        return min(1.0, saved / self.gpu_seconds) if self.gpu_seconds > 0 else 0.0


class LedgerRowFigures(TypedDict):
    """A ledger row as the API has it."""

    group: str
    month: str
    pairs: int
    realised_usd: float
    promised_usd: float
    jobs: list[str]


class CalibrationFigures(TypedDict):
    """A cause's calibration as the API has it."""

    cause: str
    pairs: int
    median_promised_fraction: float
    median_realised_fraction: float
    factor: float | None


@dataclass(frozen=True, slots=True)
class Saving:
    """One pair's saving, as ``GET /jobs/{id}`` shows it in ``savings`` (contract of issue 46)."""

    work_key: str
    compared_with: str
    unit: Literal["progress", "run"]
    fix_cause: str | None
    fix_share_before: float
    fix_share_after: float
    promised_fraction: float | None
    promised_usd: float | None
    realised_fraction: float | None
    realised_usd: float | None
    noise_fraction: float | None
    verdict: Verdict
    reason: str | None
    capped: bool = False
    # Nothing says the work changed (compared, or a running later run of the same shape).
    same_work: bool = False

    @property
    def applied_cause(self) -> str | None:
        """The cause whose fix this run already applies (so it is never told that fix): the
        fix read from the shares, on a pair whose work did not change; None where none."""
        return self.fix_cause if self.same_work else None

    def as_dict(self) -> dict[str, Any]:
        """The API's form (the contract's fields)."""
        return {
            "work_key": self.work_key,
            "compared_with": self.compared_with,
            "unit": self.unit,
            "fix_cause": self.fix_cause,
            "fix_share_before": self.fix_share_before,
            "fix_share_after": self.fix_share_after,
            "promised_fraction": self.promised_fraction,
            "promised_usd": self.promised_usd,
            "realised_fraction": self.realised_fraction,
            "realised_usd": self.realised_usd,
            "noise_fraction": self.noise_fraction,
            "verdict": self.verdict,
            "reason": self.reason,
            "fix_applied": self.applied_cause is not None,
        }


def told_fixes(money: RunMoney) -> list[Recommendation]:
    """The cause fixes a run was told, with a saving, largest first."""
    fixes = [f for f in money.fixes if f.kind == "cause" and f.cause and f.saving_fraction > 0]
    return sorted(fixes, key=lambda f: -(f.seconds * f.saving_fraction))


def was_told_a_fix(money: RunMoney) -> bool:
    """Whether the run was told a fix with a saving (so its next run is checked)."""
    return bool(told_fixes(money))


def applied_fix(
    before: RunMoney, after: RunMoney, per_unit_before: float = 1.0, per_unit_after: float = 1.0
) -> tuple[Recommendation | None, float, float]:
    """The fix the later run applied (the told fix whose cause's GPU-seconds per unit of work
    fell most, by at least half its promise), with that cause's share before and after; where
    none fell, None with the shares of the largest fix told.

    Per unit of work, not share of the run: a CUDA graph, pinned copies or bf16 leave a run
    launch-, transfer- or memory-bound (its share stays) while each step takes a fifth of the
    time; a start-up second of input starvation gone is then not the fix that was applied."""
    fixes = told_fixes(before)
    if not fixes:
        return None, 0.0, 0.0
    best: tuple[float, Recommendation] | None = None
    for f in fixes:
        assert f.cause is not None
        b = before.cause_shares.get(f.cause, 0.0) * per_unit_before
        a = after.cause_shares.get(f.cause, 0.0) * per_unit_after
        applied = a <= b * (1 - APPLIED_SHARE_RATIO * f.saving_fraction)
        if b > 0 and applied and (best is None or b - a > best[0]):
            best = (b - a, f)
    shown = best[1] if best else fixes[0]
    assert shown.cause is not None
    return (
        best[1] if best else None,
        before.cause_shares.get(shown.cause, 0.0),
        after.cause_shares.get(shown.cause, 0.0),
    )


def _promise(fix: Recommendation | None, before: RunMoney) -> tuple[float | None, float | None]:
    """The promised share of the earlier run and its USD, of ``fix``."""
    if fix is None or before.gpu_seconds <= 0:
        return None, None
    return min(1.0, fix.seconds * fix.saving_fraction / before.gpu_seconds), fix.saving_usd


def realised(
    pair: Pair,
    before: RunMoney,
    after: RunMoney,
    *,
    noise_floor: float,
) -> Saving:
    """The saving of ``pair``: realised share and USD beside the applied fix's promise, its
    noise band and verdict (not_compared with the pair's reason where it has one)."""
    per_unit = (pair.before.per_unit, pair.after.per_unit)
    fix, share_b, share_a = (
        applied_fix(before, after, *per_unit) if all(per_unit) else (applied_fix(before, after))
    )
    promised_fraction, promised_usd = _promise(fix, before)
    base = Saving(
        work_key=pair.after.key.key,
        compared_with=pair.before.job_id,
        unit="progress" if pair.unit == "progress" else "run",
        fix_cause=fix.cause if fix else None,
        fix_share_before=share_b,
        fix_share_after=share_a,
        promised_fraction=promised_fraction,
        promised_usd=promised_usd,
        realised_fraction=None,
        realised_usd=None,
        noise_fraction=None,
        verdict="not_compared",
        reason=pair.reason,
        same_work=pair.same_work_so_far,
    )
    if pair.reason is not None:
        return base
    for which, run in (("earlier", pair.before), ("later", pair.after)):
        if run.gpu_seconds <= 0:
            return replace(base, reason=f"the {which} run held no GPU time", same_work=False)
    noise = noise_fraction(pair.history, noise_floor)
    fraction = 1 - pair.after.per_unit / pair.before.per_unit
    ceiling = before.waste_fraction()
    capped = fraction > ceiling
    reason = None
    if capped:
        reason = (
            f"capped at the earlier run's waste ({ceiling:.1%} of it; measured {fraction:.1%}): "
            "the rest came from elsewhere (a faster node, less work)"
        )
        fraction = ceiling
    verdict: Verdict = (
        "saved" if fraction > noise else "worse" if fraction < -noise else "no_measurable_change"
    )
    if verdict == "no_measurable_change":
        reason = f"{fraction:+.1%} is inside the key's run-to-run noise (±{noise:.1%})"
    usd = _realised_usd(fraction, before, after) if verdict != "no_measurable_change" else 0.0
    return replace(
        base, realised_fraction=fraction, realised_usd=usd, noise_fraction=noise,
        verdict=verdict, reason=reason, capped=capped,
    )  # fmt: skip


def _realised_usd(fraction: float, before: RunMoney, after: RunMoney) -> float | None:
    """``fraction`` of the earlier run's GPU-seconds at the later run's price per GPU-second,
    never more than the earlier run's waste; None unpriced."""
    if after.cost_usd is None or after.gpu_seconds <= 0:
        return None
    usd = fraction * before.gpu_seconds * after.cost_usd / after.gpu_seconds
    if before.waste_usd is not None:
        usd = min(usd, before.waste_usd)
    return usd


# --- ledger and calibration ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LedgerPair:
    """One compared pair in the ledger: the later run, its owner, the month it ended in, and
    its saving."""

    job_id: str
    team: str | None
    user: str | None
    project: str | None
    month: str  # YYYY-MM of the later run's end, UTC
    saving: Saving


def counts_in_ledger(s: Saving) -> bool:
    """Whether a pair's saving is booked: a fix was applied and the runs were compared."""
    return s.fix_cause is not None and s.verdict != "not_compared" and s.realised_usd is not None


def cents(usd: float) -> int:
    """USD as whole cents (half away from zero), the unit the ledger adds in."""
    return round(usd * 100 + (1e-9 if usd >= 0 else -1e-9))


@dataclass(slots=True)
class LedgerRow:
    """Realised and promised USD (whole cents) of one group in one month, and its pairs."""

    group: str
    month: str
    pairs: int = 0
    realised_cents: int = 0
    promised_cents: int = 0
    job_ids: list[str] = field(default_factory=list)

    def as_dict(self) -> LedgerRowFigures:
        """The API's form of the row."""
        return {
            "group": self.group,
            "month": self.month,
            "pairs": self.pairs,
            "realised_usd": self.realised_cents / 100,
            "promised_usd": self.promised_cents / 100,
            "jobs": list(self.job_ids),
        }


def ledger(pairs: Iterable[LedgerPair], group_by: str) -> list[LedgerRow]:
    """Realised and promised savings per group and month, each pair's USD rounded to the cent
    first so every sum is exact."""
    rows: dict[tuple[str, str], LedgerRow] = {}
    for p in pairs:
        if not counts_in_ledger(p.saving):
            continue
        group = {"team": p.team, "user": p.user, "project": p.project}.get(group_by) or "-"
        row = rows.setdefault((group, p.month), LedgerRow(group=group, month=p.month))
        row.pairs += 1
        row.realised_cents += cents(p.saving.realised_usd or 0.0)
        row.promised_cents += cents(p.saving.promised_usd or 0.0)
        row.job_ids.append(p.job_id)
    return [rows[k] for k in sorted(rows)]


@dataclass(frozen=True, slots=True)
class Calibration:
    """A cause's pairs, median promised and realised shares, and the factor promises carry
    (None under ``CALIBRATION_MIN_PAIRS`` pairs)."""

    cause: str
    pairs: int
    median_promised: float
    median_realised: float
    factor: float | None

    def as_dict(self) -> CalibrationFigures:
        """The API's form of the row."""
        return {
            "cause": self.cause,
            "pairs": self.pairs,
            "median_promised_fraction": self.median_promised,
            "median_realised_fraction": self.median_realised,
            "factor": self.factor,
        }


def calibration(
    savings: Iterable[Saving], min_pairs: int = CALIBRATION_MIN_PAIRS
) -> list[Calibration]:
    """Per cause: its compared pairs' median promised and realised shares, and the factor
    (median realised / median promised) where it has ``min_pairs`` pairs or more."""
    by_cause: dict[str, list[tuple[float, float]]] = {}
    for s in savings:
        if (
            s.fix_cause is None
            or s.verdict == "not_compared"
            or s.promised_fraction is None
            or s.realised_fraction is None
        ):
            continue
        by_cause.setdefault(s.fix_cause, []).append((s.promised_fraction, s.realised_fraction))
    out = []
    for cause in sorted(by_cause):
        values = by_cause[cause]
        promised = statistics.median(p for p, _ in values)
        real = statistics.median(r for _, r in values)
        factor = None
        if len(values) >= min_pairs and promised > 0:
            factor = max(0.0, real / promised)
        out.append(Calibration(cause, len(values), promised, real, factor))
    return out


def calibrated(
    fix: Recommendation, table: Sequence[Calibration]
) -> tuple[float | None, float | None]:
    """The calibration factor of ``fix``'s cause and its saving (USD) once calibrated, never
    more than the fix's own base; (None, None) where its cause has no factor."""
    for row in table:
        if row.cause == fix.cause and row.factor is not None:
            if fix.saving_usd is None:
                return row.factor, None
            ceiling = fix.usd if fix.usd is not None else fix.saving_usd
            return row.factor, min(ceiling, fix.saving_usd * row.factor)
    return None, None
