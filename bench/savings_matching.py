"""Proven savings' matching (issue 46): how well and how fast later runs are paired with the
earlier run of their work told a fix (each told run with its first later run whose work did not
change), on the labelled synthetic histories of the tests (every run told a fix).

For each seed, the histories' precision and recall (the test asserts >= 95% and >= 70% on seed
46), then the pure core's cost per later run: its work key from the job's fields, the pairing
against the runs of its key (at most 200, as a job page reads them) and the realised saving, beside
the target (a job page may spend 1 ms on it; its two job summaries cost far more).

    flock /tmp/bench.lock .venv/bin/python -m bench.savings_matching          # --seeds 46 1 2 3
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from functools import partial
from pathlib import Path

from bench.common import machine
from service.core.matching import MatchRules, Run, match_of
from service.core.work_key import JobFacts, work_key_of
from service.costs.recommend import Recommendation
from service.costs.savings import RunMoney, realised
from tests.savings_support import LabelledRun, labelled_histories

TARGET_US_PER_RUN = 1_000.0


def _told(truth: dict[str, LabelledRun], run: Run) -> float:
    """Every run is told a fix: its waste share is what the fixes could save."""
    return truth[run.job_id].waste_fraction


def main() -> None:
    """Print precision, recall and the time per later run for each seed."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, nargs="+", default=[46, 1, 2, 3])
    ap.add_argument("--histories", type=int, default=240)
    args = ap.parse_args()
    rules = MatchRules()
    fix = Recommendation("cause", "input_starved", "workers", 1000.0, 1.0, 0.5, 0.5, "")
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"machine: {machine()}; load {' '.join(load)}")
    for seed in args.seeds:
        labelled = labelled_histories(seed, args.histories)
        runs = [lr.run for lr in labelled.runs]
        truth = {lr.run.job_id: lr for lr in labelled.runs}
        by_key = defaultdict(list)
        for r in runs:
            by_key[r.key.key].append(r)
        tp = fp = fn = 0
        began = time.perf_counter()
        for lr in labelled.runs:
            facts = JobFacts(lr.run.job_id, None, None, {"work": lr.work}, ("H100",))
            work_key_of(facts)
            pair = match_of(by_key[lr.run.key.key], lr.run, rules, partial(_told, truth))
            if pair is None:
                continue
            money = RunMoney(pair.before.gpu_seconds, 4.0, 2.0, {"input_starved": 0.5}, (fix,))
            realised(pair, money, money, noise_floor=0.05)
            before = truth[pair.before.job_id]
            same = (before.work, before.version) == (lr.work, lr.version)
            tp += same and pair.reason is None
            fp += pair.reason is None and not same
            fn += same and pair.reason is not None
        us = (time.perf_counter() - began) / len(runs) * 1e6
        print(
            f"seed {seed}: {labelled.histories} histories, {len(runs)} runs: precision "
            f"{tp / (tp + fp):.1%}, recall {tp / (tp + fn):.1%}; {us:.1f} us per later run "
            f"(target {TARGET_US_PER_RUN:.0f} us)"
        )


if __name__ == "__main__":
    main()
