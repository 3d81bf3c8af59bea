"""The job id rules of service.core.job_ids: no control characters, and Slurm's and Kubernetes'
one spelling, with a final newline never slipping past a pattern's end."""

from __future__ import annotations

import pytest

from service.core.job_ids import SLURM_ID, job_id_problem


@pytest.mark.parametrize(
    "job_id",
    ["slurm:101", "slurm:101_0", "slurm:101_7", "slurm:101+1", "k8s:ml/train-0",
     "k8s:0b1f3c2e-aaaa-bbbb-cccc-0123456789ab", "kubernetes:ml/a.b", "ray:ml team/x?y#z",
     "a|b%2Fc%d", "lsf:42 ü/λ"],
)  # fmt: skip
def test_canonical_and_unscheduled_ids_are_taken(job_id: str) -> None:
    assert job_id_problem(job_id) is None


@pytest.mark.parametrize(
    ("job_id", "said"),
    [
        ("slurm:101\n", "control characters (found U+000A)"),
        ("ray:x\ty", "control characters (found U+0009)"),
        ("ray:x\x7f", "control characters (found U+007F)"),
        ("ray:x\x9b", "control characters (found U+009B)"),
        ("ray:x\u2029", "control characters (found U+2029)"),
        ("slurm:0101", "without leading zeros"),
        ("slurm:0", "is not a Slurm job id"),
        ("slurm:101 ", "is not a Slurm job id"),
        ("slurm:5 -u root", "is not a Slurm job id"),
        ("slurm:101_01", "is not a Slurm job id"),
        ("k8s:kube-system/..", "DNS-1123"),
        ("k8s:ml/.", "DNS-1123"),
        ("k8s:ML/train", "DNS-1123 label"),
        ("k8s:ml/-x", "DNS-1123 subdomain"),
    ],
)
def test_control_characters_and_other_spellings_are_refused(job_id: str, said: str) -> None:
    problem = job_id_problem(job_id)
    assert problem is not None and said in problem, problem


def test_a_final_newline_does_not_match_the_slurm_pattern_either() -> None:
    # A caller that uses the pattern alone (a driver) must not take "101\n" as job 101.
    assert SLURM_ID.match("101") and not SLURM_ID.match("101\n")
