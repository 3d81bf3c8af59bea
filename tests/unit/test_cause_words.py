"""Each cause's meaning and fix are written once, in service.core.diagnosis, and docs/diagnosis.md
shows those very words."""

from __future__ import annotations

from pathlib import Path

from service.core.diagnosis import CAUSE_FIX, CAUSE_MEANING, CAUSES, WASTE_CAUSES

DOC = Path(__file__).resolve().parents[2] / "docs" / "diagnosis.md"


def test_the_cause_table_of_the_docs_is_the_code_s() -> None:
    text = DOC.read_text()
    table = text[text.index("| cause | meaning |") :].split("\n\n")[0].splitlines()[2:]
    rows = {
        cells[0].strip("` "): (cells[1].strip(), cells[2].strip())
        for line in table
        for cells in [line.strip("|").split(" | ")]
    }
    want = {c.label: (CAUSE_MEANING[c], CAUSE_FIX.get(c, "-")) for c in CAUSES}
    assert {k: rows.get(k) for k in want} == want


def test_every_waste_cause_has_a_fix_and_healthy_time_none() -> None:
    assert set(CAUSE_FIX) == set(WASTE_CAUSES)
    assert all(CAUSE_MEANING[c] for c in CAUSES)
