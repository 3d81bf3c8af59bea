"""A job's verdict so far: its cost and waste in dollars, its top cause, that cause's fix and
what the fix saves, with one name per figure wherever an alert, a notice or a reclaim carries it.

Adding a figure is one field here plus the renderers that show it; stored notifications keep the
figures as flat keys beside their other fields (``FIELDS``), so old rows read back.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict


class Verdict(BaseModel):
    """What a job alert says about the job so far; every figure None where unknown."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # In the order stored notifications have always had them.
    waste_usd: float | None = None  # idle (certain) + fixable (estimated)
    cost_usd: float | None = None  # the job's cost so far, every held second priced
    idle_usd: float | None = None
    fixable_usd: float | None = None
    top_cause: str | None = None  # the cause whose fix saves most
    fix: str | None = None  # that cause's fix in words
    fix_saving_usd: float | None = None

    def waste_words(self) -> str | None:
        """The waste so far in words, e.g. "waste so far $3.00 (idle $2.00 + fixable $1.00,
        estimated)", or None when unknown."""
        if self.waste_usd is None:
            return None
        text = f"waste so far ${self.waste_usd:,.2f}"
        if self.idle_usd is not None and self.fixable_usd is not None:
            text += f" (idle ${self.idle_usd:,.2f} + fixable ${self.fixable_usd:,.2f}, estimated)"
        return text

    def cause_words(self) -> str | None:
        """The top cause and its fix in one line, e.g. "top cause: launch_bound; fix: CUDA
        graphs, ... (saves about $0.67)", or None without a top cause."""
        if not self.top_cause:
            return None
        text = f"top cause: {self.top_cause}"
        if self.fix:
            text += f"; fix: {self.fix}"
            if self.fix_saving_usd is not None:
                text += f" (saves about ${self.fix_saving_usd:,.2f})"
        return text

    def amounts(self) -> dict[str, float]:
        """The known numeric figures by name (USD), in field order, for a reclaim's receiver."""
        return {
            k: float(v)
            for k, v in self.model_dump().items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }


# The figures' names, in order: the keys a notification's stored JSON holds them under.
FIELDS: tuple[str, ...] = tuple(Verdict.model_fields)
NO_VERDICT = Verdict()


def split_flat(doc: Mapping[str, object]) -> Mapping[str, object]:
    """``doc`` (a notification's fields) with its flat verdict figures moved under ``verdict``,
    so a stored row written before the figures had a type of their own reads back the same."""
    if not any(k in doc for k in FIELDS):
        return doc
    rest = {k: v for k, v in doc.items() if k not in FIELDS}
    given = doc.get("verdict")
    figures = dict(given) if isinstance(given, dict) else {}
    figures.update({k: doc[k] for k in FIELDS if k in doc})
    return rest | {"verdict": figures}
