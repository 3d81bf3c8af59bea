"""Benchmark helper: save cost reports as their CSV bytes, and compare two such folders (the
same reports run by two versions of the code) byte for byte, cell by cell.

Save: ``bench/cost_report.py --day-sums --csv-dir DIR``, ``bench/cost_days_scale.py
--csv-dir DIR``, or ``bench/report_bytes.py save DIR --db URL --code CHECKOUT SPEC...`` (the
reports SPEC, ``group_by:limit:hours_after_start:hours_before_end`` of the benches' 30 days,
run by the code of CHECKOUT: an older commit's ``git archive``, or this one).
Compare: ``bench/report_bytes.py compare OLD_DIR NEW_DIR``. For each report it prints whether
the bytes are equal; where not, how many cells differ, the largest relative difference of a
number, and how many rows changed place (near ties of the sort order).
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path
from typing import Any


def save(folder: str | None, name: str, data: dict[str, Any]) -> None:
    """Write a report's CSV (the bytes ``GET /api/v1/reports/cost?format=csv`` answers) as
    ``folder/name.csv``; nothing without a folder."""
    if folder is None:
        return
    from service.api.routers.reports import to_csv

    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    (path / f"{name}.csv").write_bytes(to_csv(data).encode())


def compare(old: bytes, new: bytes) -> str:
    """One line saying how two CSV reports differ."""
    if old == new:
        return "bytes equal"
    a = list(csv.reader(io.StringIO(old.decode())))
    b = list(csv.reader(io.StringIO(new.decode())))
    if len(a) != len(b):
        return f"{len(a)} rows against {len(b)}"
    moved = sum(x[0] != y[0] for x, y in zip(a, b, strict=True))
    by_key = {row[0]: row for row in b}
    cells = differ = 0
    worst = 0.0
    for row in a:
        other = by_key.get(row[0])
        if other is None:
            return f"row {row[0]!r} missing"
        for u, v in zip(row, other, strict=True):
            cells += 1
            if u == v:
                continue
            differ += 1
            try:
                fu, fv = float(u), float(v)
            except ValueError:
                return f"text cell differs in row {row[0]!r}: {u!r} against {v!r}"
            worst = max(worst, abs(fu - fv) / max(abs(fu), abs(fv), 1e-300))
    return (
        f"{differ} of {cells} cells differ, largest relative difference {worst:.1e}; "
        f"{moved} of {len(a) - 1} rows in another place"
    )


def run_reports(folder: str, url: str, code: str, specs: list[str]) -> None:
    """Run the reports ``specs`` on ``url`` with the code of the checkout ``code`` and save
    their CSV in ``folder``."""
    sys.path.insert(0, str(Path(code).resolve()))
    from datetime import UTC, datetime, timedelta

    from service.db.engine import make_engine
    from service.settings import Settings

    try:  # the cost report's home since the money got a package of its own
        from service.usecases.costing import cost_report
    except ImportError:  # an older checkout's
        from service.usecases import cost_report  # type: ignore[attr-defined,no-redef]

    end_of_data = datetime(2026, 12, 1, tzinfo=UTC)  # the benches' END
    engine = make_engine(url)
    with engine.connect() as conn:
        for spec in specs:
            group_by, limit, after, before = spec.split(":")
            start = end_of_data - timedelta(days=30) + timedelta(hours=float(after))
            data = cost_report.cost_report(
                conn, settings=Settings(), start=start,
                end=end_of_data - timedelta(hours=float(before)), now=end_of_data,
                group_by=group_by, limit=None if limit == "-" else int(limit),
            )  # fmt: skip
            save(folder, spec.replace(":", "_"), data)
            print(f"{spec}: saved", flush=True)
    engine.dispose()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("save", help="run reports with a checkout's code and save their CSV")
    s.add_argument("folder")
    s.add_argument("--db", required=True, help="the bench database's SQLAlchemy URL")
    s.add_argument("--code", default=str(Path(__file__).resolve().parents[1]))
    s.add_argument("specs", nargs="+", help="group_by:limit:hours_after_start:hours_before_end")
    c = sub.add_parser("compare", help="compare two folders of saved reports")
    c.add_argument("old")
    c.add_argument("new")
    args = p.parse_args()
    if args.command == "save":
        run_reports(args.folder, args.db, args.code, args.specs)
        return
    for path in sorted(Path(args.old).glob("*.csv")):
        other = Path(args.new) / path.name
        verdict = compare(path.read_bytes(), other.read_bytes()) if other.exists() else "missing"
        print(f"{path.stem}: {verdict}")


if __name__ == "__main__":
    main()
