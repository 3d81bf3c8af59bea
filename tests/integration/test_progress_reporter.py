"""The progress helper in the package (issue 46): a ProgressReporter and the Lightning and
Hugging Face callbacks send a job's running total to the real app served on loopback, at most
every N seconds, and never raise into the training loop; both stores."""

from __future__ import annotations

import subprocess
import sys
import types
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from service import progress
from service.progress import ProgressReporter, job_id_from_env
from tests.alerting_support import add_job, ingest, wait_until
from tests.support import FakeClock, auth, free_port

JOB = "slurm:4242"


@pytest.fixture
def job(http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock) -> str:
    """A running job on node-a's GPU, on a clock that reads real time (the reporter stamps its
    readings with the wall clock)."""
    clock.set(datetime.now(UTC))
    start = clock() - timedelta(minutes=10)
    ingest(http, tokens["agent"], start=start, count=6, metrics={"sm_active": 0.9})
    add_job(engine, JOB, ("GPU-a0",), started_at=start)
    return JOB


def _options(server: str, tokens: dict[str, str]) -> dict[str, Any]:
    return {"central_url": server, "token": tokens["agent"], "job_id": JOB, "env": {}}


def _values(http: httpx.Client, tokens: dict[str, str]) -> list[float]:
    r = http.get(f"/api/v1/jobs/{JOB}/progress", headers=auth(tokens["reader"]))
    assert r.status_code == 200, r.text
    return [x["value"] for x in r.json()["readings"]]


def test_sends_at_most_every_n_seconds(
    job: str, server: str, http: httpx.Client, tokens: dict[str, str]
) -> None:
    reporter = ProgressReporter(
        "samples", every_seconds=30, background=False, **_options(server, tokens)
    )
    assert reporter.send_due(now_monotonic=1000.0)  # the starting total, at once
    reporter.advance(64)
    assert not reporter.send_due(now_monotonic=1010.0)  # 10 s later: too soon
    reporter.advance(64)
    assert reporter.send_due(now_monotonic=1031.0)
    assert not reporter.send_due(now_monotonic=1100.0)  # unchanged: nothing to send
    reporter.set(1000)
    reporter.close()  # the last total goes at close
    assert _values(http, tokens) == [0.0, 128.0, 1000.0]
    reporter.advance(5)  # after close: ignored, no error
    assert reporter.sent_count == 3


def test_background_thread_sends_and_close_sends_the_last(
    job: str, server: str, http: httpx.Client, tokens: dict[str, str]
) -> None:
    with ProgressReporter("steps", every_seconds=1, **_options(server, tokens)) as reporter:
        wait_until(lambda: _values(http, tokens))  # the thread sent the starting total
        for _ in range(250):
            reporter.advance()
    values = _values(http, tokens)
    assert values[0] == 0.0 and values[-1] == 250.0
    assert values == sorted(values)


def test_never_raises_into_the_loop(
    job: str, server: str, http: httpx.Client, tokens: dict[str, str]
) -> None:
    # Central unreachable: nothing sent, nothing raised.
    down = ProgressReporter(
        central_url=f"http://127.0.0.1:{free_port()}",
        token="x",
        job_id=JOB,
        env={},
        background=False,
    )
    down.advance(3)
    down.flush()
    down.close()
    assert down.sent_count == 0
    # A total below the stored one (409) is logged and not sent again; bad input is ignored.
    reporter = ProgressReporter(background=False, **_options(server, tokens))
    reporter.set(10)
    reporter.flush()
    reporter.set(4)
    reporter.flush()
    reporter.advance(float("nan"))
    reporter.advance(-3)
    reporter.set(float("inf"))
    reporter.close()
    assert _values(http, tokens) == [10.0]
    # A token central refuses (403): the reporter stops.
    stranger = ProgressReporter(
        central_url=server, token=tokens["reader"], job_id=JOB, env={}, background=False
    )
    stranger.set(20)
    stranger.flush()
    assert not stranger.enabled
    stranger.close()
    # Nothing configured: a no-op.
    idle = ProgressReporter(env={})
    assert not idle.enabled
    idle.advance(1)
    idle.close()


def test_job_id_as_the_agent_gives_it(tmp_path: Path) -> None:
    ns = tmp_path / "namespace"
    assert job_id_from_env({"GPUWARDEN_JOB_ID": "exp-1", "SLURM_JOB_ID": "7"}) == "exp-1"
    assert job_id_from_env({"SLURM_JOB_ID": "4242"}) == "slurm:4242"
    assert job_id_from_env({"POD_NAMESPACE": "ml", "POD_NAME": "train-0"}) == "k8s:ml/train-0"
    ns.write_text("vision\n")
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "train-1"}
    assert job_id_from_env(env, namespace_file=ns) == "k8s:vision/train-1"
    assert job_id_from_env({"HOSTNAME": "laptop"}, namespace_file=ns) is None
    assert job_id_from_env({}) is None
    # Rank 1 of a distributed job leaves reporting to rank 0.
    env = {"GPUWARDEN_CENTRAL_URL": "http://x", "GPUWARDEN_API_TOKEN": "t", "SLURM_JOB_ID": "1"}
    assert ProgressReporter(env=env, background=False).enabled
    assert not ProgressReporter(env={**env, "RANK": "1"}, background=False).enabled


class _FakeBase:
    """Stands in for lightning's Callback and transformers' TrainerCallback."""


@pytest.fixture
def frameworks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fake ``lightning.pytorch`` and ``transformers`` modules, each with its callback class."""
    lightning = types.ModuleType("lightning")
    pytorch = types.ModuleType("lightning.pytorch")
    pytorch.Callback = _FakeBase  # type: ignore[attr-defined]
    transformers = types.ModuleType("transformers")
    transformers.TrainerCallback = _FakeBase  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lightning", lightning)
    monkeypatch.setitem(sys.modules, "lightning.pytorch", pytorch)
    monkeypatch.setitem(sys.modules, "transformers", transformers)
    monkeypatch.setattr(progress, "_BUILT", {})
    yield


def test_callbacks_need_their_framework_only_when_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "_BUILT", {})
    monkeypatch.setitem(sys.modules, "lightning", None)
    monkeypatch.setitem(sys.modules, "pytorch_lightning", None)
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError):
        _ = progress.LightningProgressCallback
    with pytest.raises(ImportError):
        _ = progress.TrainerProgressCallback
    with pytest.raises(AttributeError):
        _ = progress.NoSuchCallback


@pytest.mark.usefixtures("frameworks")
def test_lightning_callback(
    job: str, server: str, http: httpx.Client, tokens: dict[str, str]
) -> None:
    callback = progress.LightningProgressCallback(
        every_seconds=3600, background=False, **_options(server, tokens)
    )
    assert _FakeBase in type(callback).__mro__  # a subclass of the framework's class
    trainer = types.SimpleNamespace(global_step=500, is_global_zero=True)  # resumed at 500
    module = object()
    callback.on_train_start(trainer, module)
    for batch_idx in range(40):
        trainer.global_step += 1
        callback.on_train_batch_end(trainer, module, {"loss": 0.1}, [batch_idx], batch_idx)
    callback.on_train_end(trainer, module)
    assert _values(http, tokens) == [500.0, 540.0]
    r = http.get(f"/api/v1/jobs/{JOB}/progress", headers=auth(tokens["reader"]))
    assert r.json()["summary"]["units_advanced"] == 40.0


@pytest.mark.usefixtures("frameworks")
def test_trainer_callback_in_samples_from_the_main_process_only(
    job: str, server: str, http: httpx.Client, tokens: dict[str, str]
) -> None:
    args, control = types.SimpleNamespace(), types.SimpleNamespace()
    other_rank = progress.TrainerProgressCallback(
        unit="samples", per_step=32, background=False, **_options(server, tokens)
    )
    callback = progress.TrainerProgressCallback(
        unit="samples", per_step=32, every_seconds=3600, background=False,
        **_options(server, tokens),
    )  # fmt: skip
    assert _FakeBase in type(callback).__mro__  # a subclass of the framework's class
    state = types.SimpleNamespace(global_step=0, is_world_process_zero=True)
    elsewhere = types.SimpleNamespace(global_step=0, is_world_process_zero=False)
    callback.on_train_begin(args, state, control, model=None)
    other_rank.on_train_begin(args, elsewhere, control)
    for _ in range(10):
        state.global_step += 1
        callback.on_step_end(args, state, control, model=None)
        other_rank.on_step_end(args, elsewhere, control)
    callback.on_train_end(args, state, control)
    other_rank.on_train_end(args, elsewhere, control)
    assert _values(http, tokens) == [0.0, 320.0]
    r = http.get(f"/api/v1/jobs/{JOB}/progress", headers=auth(tokens["reader"]))
    assert r.json()["summary"]["unit"] == "samples"


def test_the_helper_imports_no_framework_nor_the_service() -> None:
    code = (
        "import sys, service.progress; "
        "print(sorted(m for m in ('fastapi', 'sqlalchemy', 'pydantic', 'torch', 'lightning',"
        " 'pytorch_lightning', 'transformers') if m in sys.modules))"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
