"""Each cause's code and column are declared once and only ever appended to; the idle pair and
the thresholds a fix shares with the waste model are written in one place each."""

from __future__ import annotations

from dataclasses import fields

from service.core.diagnosis import (
    CAUSE_COLUMNS,
    CAUSE_NAMES,
    CAUSES,
    IDLE_CAUSES,
    Cause,
    ThresholdSettings,
    thresholds_of,
)
from service.costs.assumptions import FixSettings, fix_assumptions_of
from service.costs.integrals import CAUSE_ENERGY_FIELDS, CAUSE_FIELDS, IDLE_FIELDS, Integrals
from service.costs.recommend import FixAssumptions
from service.settings import Settings

# The causes as they were first shipped: (name, stored code, column). Never edit a row.
SHIPPED = (
    ("idle_empty", 1, 0),
    ("idle_held", 2, 1),
    ("launch_bound", 3, 2),
    ("input_starved", 4, 3),
    ("transfer_bound", 5, 4),
    ("memory_bound", 6, 5),
    ("compute_no_tensor", 7, 6),
    ("compute_tensor", 8, 7),
    ("unclassified", 9, 8),
)


def test_a_new_cause_is_appended_never_inserted() -> None:
    """Append, never insert: a cause's code is stored in every sample and rollup row, and its
    column is its place in every per-cause sequence (``CAUSE_FIELDS``, a summary's USD per
    cause, the day sums). A cause inserted in the middle would move the codes or columns of
    the causes after it, and memory_bound would read stored samples, or another cause's
    seconds and dollars, as its own. So every shipped cause keeps its code and column, and a
    new one takes the next code and the next column."""
    shipped = {name: (code, column) for name, code, column in SHIPPED}
    assert [(c.label, int(c), c.column) for c in CAUSES][: len(SHIPPED)] == list(SHIPPED)
    for cause in CAUSES:
        if cause.label not in shipped:
            assert int(cause) > len(SHIPPED) and cause.column >= len(SHIPPED), cause.label


def test_columns_are_the_positions_of_every_per_cause_sequence() -> None:
    assert sorted(CAUSE_COLUMNS.values()) == list(range(len(Cause)))
    assert set(CAUSE_COLUMNS) == set(Cause)
    for cause in Cause:
        assert CAUSES[cause.column] is cause
        assert CAUSE_NAMES[cause.column] == cause.label
        assert CAUSE_FIELDS[cause.column] == f"{cause.label}_seconds"
        assert CAUSE_ENERGY_FIELDS[cause.column] == f"{cause.label}_energy_joules"


def test_idle_seconds_are_the_idle_causes_seconds() -> None:
    assert IDLE_CAUSES == (Cause.IDLE_EMPTY, Cause.IDLE_HELD)
    assert IDLE_FIELDS == ("idle_empty_seconds", "idle_held_seconds")
    assert {f.name for f in fields(Integrals)} >= set(IDLE_FIELDS)


def test_the_shared_thresholds_are_read_from_the_settings_once() -> None:
    """The five cause thresholds a fix estimate shares with the waste model are read by
    ``thresholds_of`` alone: the fixes' settings declare only their own."""
    own = {n for n in vars(FixSettings) if not n.startswith("_")}
    shared = {n for n in vars(ThresholdSettings) if not n.startswith("_")}
    assert own == {"fix_tensor_speedup", "fix_memory_speedup"} | {
        "rightsize_idle_gpu_fraction",
        "rightsize_mig_memory_headroom",
    }
    assert "cause_busy" in shared and not own & shared
    s = Settings(
        cause_starved_util=0.4,
        cause_launch_fill=0.3,
        cause_busy=0.6,
        cause_launch_min_util=0.2,
        cause_transfer_bytes_per_second=3e9,
    )
    t, a = thresholds_of(s), fix_assumptions_of(s)
    for name in ("starved_util", "launch_fill", "busy", "launch_min_util"):
        assert getattr(a, name) == getattr(t, name) != getattr(FixAssumptions(), name)
    assert a.transfer_bytes_per_second == t.transfer_bytes_per_second == 3e9
