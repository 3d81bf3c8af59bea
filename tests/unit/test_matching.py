"""Matching a run told a fix to the later runs of its work (issue 46): on a labelled set of 240
synthetic histories, precision >= 95% and recall >= 70%; the first later run whose work did not
change is the one compared, seen alike from the told run and from the later one; and each reason
a pair is not compared."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta

from service.core.matching import MatchRules, Run, match_of, matches, noise_fraction, pair_of
from service.core.work_key import JobFacts, work_key_of
from tests.savings_support import T0, labelled_histories

RULES = MatchRules()


def test_precision_and_recall_on_the_labelled_histories() -> None:
    labelled = labelled_histories()
    assert labelled.histories >= 200
    assert {"slurm", "k8s_job", "k8s_cron", "k8s_deploy", "manual"} <= set(labelled.kinds)
    runs = [lr.run for lr in labelled.runs]
    truth = {lr.run.job_id: lr for lr in labelled.runs}
    tp = fp = fn = tn = 0
    for lr in labelled.runs:
        pair = match_of(runs, lr.run, RULES, lambda r: truth[r.job_id].waste_fraction)
        if pair is None:
            continue
        before = truth[pair.before.job_id]
        same = (before.work, before.version) == (lr.work, lr.version)
        compared = pair.reason is None
        tp += same and compared
        fp += compared and not same
        fn += same and not compared
        tn += not same and not compared
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    # Changed work is mixed in, and most of it is caught.
    assert tn >= 50, (tp, fp, fn, tn)
    assert precision >= 0.95, (precision, tp, fp, fn, tn)
    assert recall >= 0.70, (recall, tp, fp, fn, tn)


def test_a_told_run_is_compared_with_its_first_unchanged_later_run_from_both_sides() -> None:
    labelled = labelled_histories()
    runs = [lr.run for lr in labelled.runs]
    waste = {lr.run.job_id: lr.waste_fraction for lr in labelled.runs}
    rng = random.Random(46)
    told_ids = {r.job_id for r in runs if rng.random() < 0.6}

    def told(run: Run) -> float | None:
        return waste[run.job_id] if run.job_id in told_ids else None

    compared = 0
    for run in runs:
        pair = match_of(runs, run, RULES, told)
        if pair is None:
            continue
        assert pair.before.job_id in told_ids
        found = matches(runs, pair.before, RULES, waste[pair.before.job_id])
        # The later run is among the told run's later runs, up to the first unchanged one.
        assert run.job_id in [p.after.job_id for p in found]
        if pair.reason is None:
            compared += 1
            assert found[-1].after.job_id == run.job_id and found[-1].reason is None
            assert all(p.reason is not None for p in found[:-1])
            # The noise is the spread of the runs up to the told one (before the fix).
            assert all(r.ended_at <= pair.before.ended_at for r in pair.history)  # type: ignore[operator]
    for job_id in sorted(told_ids):
        run = next(r for r in runs if r.job_id == job_id)
        found = matches(runs, run, RULES, waste[job_id])
        if found and found[-1].reason is None:  # its first unchanged later run is compared
            pair = match_of(runs, found[-1].after, RULES, told)
            assert pair is not None and pair.reason is None
    assert compared >= 100


def _run(job_id: str, day: float, gpu_seconds: float, units: float | None = None,
         gpus: int = 1, model: str = "H100", script: str | None = None) -> Run:  # fmt: skip
    labels = {"name": "train", "account": "a", "partition": "gpu"}
    if script:
        labels["script_sha256"] = script
    key = work_key_of(JobFacts(job_id, "alice", "ml", labels, (model,) * gpus))
    start = T0 + timedelta(days=day)
    return Run(job_id, key, start, start + timedelta(seconds=gpu_seconds / gpus), gpu_seconds,
               units, "steps" if units else None)  # fmt: skip


def test_reasons_a_pair_is_not_compared() -> None:
    first = _run("slurm:1", 0, 3600, script="aa")
    cases = [
        (_run("slurm:2", 1, 3600, gpus=2, script="aa"), "other GPU count (1 before, 2 after)"),
        (_run("slurm:2", 1, 3600, model="A100", script="aa"), "other GPU model"),
        (_run("slurm:2", 1, 3600, script="bb"), "different script hash"),
        (_run("slurm:2", 1, 3600, units=100, script="aa"), "only the later run reported"),
        (_run("slurm:2", 1, 9000, script="aa"), "duration outside the key's usual spread"),
    ]
    for later, reason in cases:
        pair = pair_of([first, later], later, RULES, 0.5)
        assert pair is not None and pair.reason is not None and pair.reason.startswith(reason)
    # A run shorter by what the fixes could save is compared; far shorter is other work.
    shorter = _run("slurm:2", 1, 3600 * 0.55, script="aa")
    assert pair_of([first, shorter], shorter, RULES, 0.5).reason is None  # type: ignore[union-attr]
    tiny = _run("slurm:2", 1, 3600 * 0.3, script="aa")
    assert pair_of([first, tiny], tiny, RULES, 0.5).reason is not None  # type: ignore[union-attr]
    # With progress, the length says nothing: per unit is compared.
    a, b = _run("slurm:1", 0, 3600, units=1000), _run("slurm:2", 1, 9000, units=2500)
    pair = pair_of([a, b], b, RULES, 0.5)
    assert pair is not None and pair.reason is None and pair.unit == "progress"
    # A running later run is not compared yet.
    running = replace(_run("slurm:2", 1, 3600, script="aa"), ended_at=None)
    assert pair_of([first, running], running, RULES).reason == "the later run has not ended"  # type: ignore[union-attr]


def test_the_horizon_and_the_last_earlier_run() -> None:
    a, b = _run("slurm:1", 0, 3600), _run("slurm:2", 2, 3600)
    late = _run("slurm:3", 40, 3600)
    assert pair_of([a, b, late], late, RULES) is None  # b ended 38 days before
    c = _run("slurm:3", 5, 3600)
    pair = pair_of([a, b, c], c, RULES)
    assert pair is not None and pair.before.job_id == "slurm:2"
    assert [r.job_id for r in pair.history] == ["slurm:1", "slurm:2"]
    assert pair_of([a, b, c], a, RULES) is None


def test_noise_is_the_spread_of_the_runs_before_at_least_the_floor() -> None:
    runs = [_run(f"slurm:{i}", i, s) for i, s in enumerate((1000, 1100, 900))]
    assert noise_fraction(runs, 0.05) == (1100 - 900) / 1000
    assert noise_fraction(runs[:1], 0.05) == 0.05


def told_of(waste: dict[str, float]) -> Callable[[Run], float | None]:
    """``told`` of the runs ``waste`` names (their max saving fraction)."""
    return lambda run: waste.get(run.job_id)


def test_a_fix_applied_after_a_run_of_other_work_is_compared_with_the_told_run() -> None:
    told = _run("slurm:1", 0, 3600, script="aa")
    other = _run("slurm:2", 2, 3600, gpus=2, script="aa")  # another GPU count: not compared
    fixed = _run("slurm:3", 4, 2000, script="aa")
    runs = [told, other, fixed]
    waste = {"slurm:1": 0.5}
    pair = match_of(runs, fixed, RULES, told_of(waste))
    assert pair is not None and pair.reason is None and pair.before.job_id == "slurm:1"
    shown = match_of(runs, other, RULES, told_of(waste))
    assert shown is not None and shown.before.job_id == "slurm:1"
    assert shown.reason == "other GPU count (1 before, 2 after)"
    assert [(p.after.job_id, p.reason is None) for p in matches(runs, told, RULES, 0.5)] == [
        ("slurm:2", False),
        ("slurm:3", True),
    ]
    # The run just before would have been the pair: told nothing, it gives none.
    assert pair_of(runs, fixed, RULES).before.job_id == "slurm:2"  # type: ignore[union-attr]


def test_a_told_run_is_compared_once_and_an_untold_run_in_between_takes_it() -> None:
    told = _run("slurm:1", 0, 3600, script="aa")
    same = _run("slurm:2", 2, 3500, script="aa")  # the next run, the fix not applied yet
    fixed = _run("slurm:3", 4, 2000, script="aa")
    runs = [told, same, fixed]
    waste = {"slurm:1": 0.5}
    assert match_of(runs, same, RULES, told_of(waste)).before.job_id == "slurm:1"  # type: ignore[union-attr]
    assert match_of(runs, fixed, RULES, told_of(waste)) is None  # slurm:1 is compared already
    waste["slurm:2"] = 0.5  # told too: the fixed run is compared with it
    assert match_of(runs, fixed, RULES, told_of(waste)).before.job_id == "slurm:2"  # type: ignore[union-attr]
    # Beyond the horizon of the told run, nothing.
    late = _run("slurm:4", 40, 2000, script="aa")
    assert match_of([told, late], late, RULES, told_of(waste)) is None
