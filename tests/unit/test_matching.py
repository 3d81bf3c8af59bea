"""Matching a run to the earlier run of its work (issue 46): on a labelled set of 240 synthetic
histories, precision >= 95% and recall >= 70%; and each reason a pair is not compared."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from service.core.matching import MatchRules, Run, noise_fraction, pair_of
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
        pair = pair_of(runs, lr.run, RULES, truth[lr.run.job_id].waste_fraction)
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
