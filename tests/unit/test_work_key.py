"""A job's work key (issue 46): runs of one work share it, other work does not, and the shape
of each run (GPUs, model, script, image) is kept beside it."""

from __future__ import annotations

from service.core.work_key import JobFacts, key_of_row, pod_owner, work_key_of


def _slurm(job_id: str, **labels: str) -> JobFacts:
    base = {"name": "train", "account": "proj7", "partition": "gpu"}
    return JobFacts(job_id, "alice", "ml", {**base, **labels}, ("NVIDIA H100",) * 2)


def test_slurm_runs_of_one_script_share_a_key_and_keep_their_shape() -> None:
    a = work_key_of(_slurm("slurm:1", script_sha256="aa"))
    b = work_key_of(_slurm("slurm:2", script_sha256="bb"))
    assert a.key == b.key and a.kind == "slurm"
    assert (a.script_sha256, b.script_sha256) == ("aa", "bb")
    assert (a.gpu_count, a.gpu_model) == (2, "NVIDIA H100")
    assert dict(a.identity) == {"name": "train", "user": "alice", "account": "proj7",
                                "partition": "gpu"}  # fmt: skip
    # Another name, user or partition is other work.
    assert work_key_of(_slurm("slurm:3", name="eval")).key != a.key
    assert work_key_of(_slurm("slurm:4", partition="debug")).key != a.key
    other_user = JobFacts("slurm:5", "bob", "ml", _slurm("slurm:5").labels)
    assert work_key_of(other_user).key != a.key


def test_a_slurm_job_without_a_name_is_its_script_or_a_one_off() -> None:
    a = work_key_of(JobFacts("slurm:1", "alice", "ml", {"partition": "gpu"}))
    b = work_key_of(JobFacts("slurm:2", "alice", "ml", {"partition": "gpu"}))
    assert a.kind == "one_off" and a.key != b.key
    c = work_key_of(JobFacts("slurm:3", "alice", "ml", {"script_sha256": "aa"}))
    d = work_key_of(JobFacts("slurm:4", "alice", "ml", {"script_sha256": "aa"}))
    e = work_key_of(JobFacts("slurm:5", "alice", "ml", {"script_sha256": "bb"}))
    assert c.kind == "slurm" and c.key == d.key != e.key


def test_the_work_label_wins_and_is_the_users_word() -> None:
    a = work_key_of(_slurm("slurm:1", work="bert", script_sha256="aa"))
    b = work_key_of(JobFacts("manual:9", "alice", None, {"work": "bert"}))
    assert a.key == b.key and a.kind == "work_label"
    assert a.script_sha256 is None  # the user said the runs are one work
    assert work_key_of(JobFacts("manual:9", "bob", None, {"work": "bert"})).key != a.key


def test_kubernetes_owner_from_the_pod_name_or_labels() -> None:
    assert pod_owner("trainer-7d9f8b6c5d-x2vlq") == ("Deployment", "trainer")
    assert pod_owner("nightly-29412345-kq2zt") == ("CronJob", "nightly")
    assert pod_owner("finetune-8xk2p") == ("Job", "finetune")
    assert pod_owner("ranker-3") == ("StatefulSet", "ranker")
    assert pod_owner("jupyter-alice") == ("notebook", "alice")
    assert pod_owner("debugpod") is None
    one = work_key_of(JobFacts("k8s:ml/finetune-8xk2p", None, None, {"image": "r/t:1"}))
    two = work_key_of(JobFacts("k8s:ml/finetune-q7wzr", None, None, {"image": "r/t:2"}))
    assert one.key == two.key and one.kind == "kubernetes"
    assert (one.image, two.image) == ("r/t:1", "r/t:2")
    # Another namespace is other work; a bare pod is a one-off.
    assert work_key_of(JobFacts("k8s:cv/finetune-8xk2p", None, None, {})).key != one.key
    assert work_key_of(JobFacts("k8s:ml/debugpod", None, None, {})).kind == "one_off"
    # The owner labels, where the agent sends them, win over the name.
    labelled = JobFacts("k8s:ml/x", None, None, {"workload_kind": "Job", "workload": "finetune"})
    assert work_key_of(labelled).key == one.key


def test_the_stored_key_is_the_keys_own() -> None:
    facts = _slurm("slurm:1")
    assert key_of_row("slurm:1", "alice", "ml", facts.labels) == work_key_of(facts).key
