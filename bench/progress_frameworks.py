"""The progress helpers against the real frameworks (issue 46): a real central (SQLite, served in
a subprocess on loopback), one job per framework, a tiny model trained for ``--steps`` steps with
(a) a plain PyTorch loop and ``ProgressReporter``, (b) ``lightning.Trainer`` with
``LightningProgressCallback``, (c) ``transformers.Trainer`` with ``TrainerProgressCallback`` (a
model built from a config, no download, a torch ``Dataset``); then, per framework, the steps
trained beside the progress central reports (``GET /api/v1/jobs/{id}/progress``). Exits 1 where
one differs, 2 where a framework is missing (``--dry-run``: skipped, and said so).

A reporter-only check (no framework: the loop moves a ``ProgressReporter`` by hand) always runs,
so ``--dry-run`` on a machine without torch still checks the central part. Needs only what the
central needs; each framework is imported in its own check. CPU is enough (CUDA used where there).

    PYTHONPATH=. .venv/bin/python bench/progress_frameworks.py --dry-run   # here: no torch
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    PYTHONPATH=.:/tmp/site python3 bench/progress_frameworks.py            # torch, lightning, transformers
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

if __package__ in (None, ""):  # run as a file: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import gpuwarden
from bench.common import served as common_served
from service.progress import ProgressReporter

EVERY_SECONDS = 1.0  # the reporters' send interval (the least they take)


@dataclass(frozen=True, slots=True)
class Central:
    """A served central: its base URL and an admin token."""

    url: str
    token: str

    def client(self) -> httpx.Client:
        """A client of the API with the admin token."""
        return httpx.Client(
            base_url=f"{self.url}/api/v1",
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=30,
        )


@dataclass(frozen=True, slots=True)
class Outcome:
    """One check: the framework, the steps it trained and what central reports (None: none)."""

    name: str
    trained: int
    reported: float | None
    detail: str = ""

    @property
    def ok(self) -> bool:
        """Whether central reports exactly the steps trained."""
        return self.reported is not None and self.reported == self.trained


@contextmanager
def served() -> Iterator[Central]:
    """A fresh SQLite central on a free loopback port, migrated, with an admin token."""
    with tempfile.TemporaryDirectory() as d:
        url = f"sqlite:///{d}/central.db"
        gpuwarden(url, "migrate")
        token = gpuwarden(url, "token", "create", "--role", "admin").strip().splitlines()[-1]
        with common_served(url, GPUWARDEN_LOG_LEVEL="WARNING") as (base, _):
            yield Central(base, token)


def register(central: Central, job_id: str) -> None:
    """Register the job, started a minute ago (its readings come after)."""
    started = (datetime.now(UTC) - timedelta(minutes=1)).isoformat().replace("+00:00", "Z")
    body = {"id": job_id, "user": "bench", "team": "bench", "labels": {"work": job_id},
            "gpus": [], "started_at": started}  # fmt: skip
    with central.client() as api:
        r = api.post("/jobs", json=body)
    if r.status_code not in (200, 201):
        raise RuntimeError(f"registering {job_id}: {r.status_code} {r.text}")


def reported(central: Central, job_id: str) -> float | None:
    """The job's progress as central reports it: the last running total (None: no reading)."""
    with central.client() as api:
        r = api.get(f"/jobs/{job_id}/progress")
    r.raise_for_status()
    summary = r.json()["summary"]
    return None if summary is None else float(summary["last_value"])


def _as_job(central: Central, job_id: str) -> None:
    """Point the helpers at ``job_id`` the way a job's environment does."""
    os.environ["GPUWARDEN_CENTRAL_URL"] = central.url
    os.environ["GPUWARDEN_API_TOKEN"] = central.token
    os.environ["GPUWARDEN_JOB_ID"] = job_id


# --- the checks: each trains, then returns the steps it trained -------------------------------


def reporter_only(steps: int) -> int:
    """No framework: a loop moves the reporter by hand (the central part, anywhere)."""
    with ProgressReporter("steps", every_seconds=EVERY_SECONDS) as progress:
        for _ in range(steps):
            time.sleep(0.01)
            progress.advance(1)
    return steps


def _tensors(n: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(46)
    x = torch.randn(n, 16, generator=g)
    return x, (x.sum(dim=1, keepdim=True) > 0).float()


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def plain_pytorch(steps: int) -> int:
    """A plain PyTorch loop with ``ProgressReporter``."""
    import torch

    x, y = _tensors(steps * 8)
    device = _device()
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    done = 0
    with ProgressReporter("steps", every_seconds=EVERY_SECONDS) as progress:
        for i in range(steps):
            xb, yb = x[i * 8 : (i + 1) * 8].to(device), y[i * 8 : (i + 1) * 8].to(device)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            done += 1
            progress.advance(1)
    return done


def lightning(steps: int) -> int:
    """``lightning.Trainer`` (else ``pytorch_lightning``) with ``LightningProgressCallback``."""
    import torch

    try:
        import lightning.pytorch as pl
    except ImportError:
        import pytorch_lightning as pl  # type: ignore[no-redef]

    from service.progress import LightningProgressCallback

    class Tiny(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
            )

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            xb, yb = batch
            return torch.nn.functional.binary_cross_entropy_with_logits(self.net(xb), yb)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    x, y = _tensors(steps * 8)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    trainer = pl.Trainer(
        max_steps=steps, max_epochs=-1, accelerator="auto", devices=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[LightningProgressCallback(every_seconds=EVERY_SECONDS)],
    )  # fmt: skip
    trainer.fit(Tiny(), loader)
    return int(trainer.global_step)


def hugging_face(steps: int) -> int:
    """``transformers.Trainer`` with ``TrainerProgressCallback``: a tiny BERT from a config."""
    import dataclasses

    import torch
    import transformers

    from service.progress import TrainerProgressCallback

    config = transformers.BertConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64, num_labels=2,
    )  # fmt: skip
    model = transformers.BertForSequenceClassification(config)

    class Sentences(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __init__(self, n: int) -> None:
            g = torch.Generator().manual_seed(46)
            self.ids = torch.randint(0, 128, (n, 16), generator=g)

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict[str, Any]:
            ids = self.ids[i]
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                    "labels": int(ids[0].item() % 2)}  # fmt: skip

    with tempfile.TemporaryDirectory() as out:
        wanted = {
            "output_dir": out, "max_steps": steps, "per_device_train_batch_size": 4,
            "learning_rate": 1e-3, "report_to": "none", "save_strategy": "no",
            "logging_strategy": "no", "disable_tqdm": True, "dataloader_num_workers": 0,
        }  # fmt: skip
        # Only the arguments this version takes (they were renamed across versions).
        known = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
        args = transformers.TrainingArguments(**{k: v for k, v in wanted.items() if k in known})
        trainer = transformers.Trainer(
            model=model, args=args, train_dataset=Sentences(steps * 4),
            callbacks=[TrainerProgressCallback(every_seconds=EVERY_SECONDS)],
        )  # fmt: skip
        trainer.train()
        return int(trainer.state.global_step)


CHECKS: tuple[tuple[str, tuple[str, ...], Callable[[int], int]], ...] = (
    ("reporter only (no framework)", (), reporter_only),
    ("plain PyTorch + ProgressReporter", ("torch",), plain_pytorch),
    ("lightning.Trainer + LightningProgressCallback", ("torch", "lightning|pytorch_lightning"),
     lightning),
    ("transformers.Trainer + TrainerProgressCallback", ("torch", "transformers"), hugging_face),
)  # fmt: skip


def missing(modules: tuple[str, ...]) -> list[str]:
    """The modules of ``modules`` (``a|b``: either) that cannot be imported here."""
    out = []
    for spec in modules:
        names = spec.split("|")
        if not any(importlib.util.find_spec(n) is not None for n in names):
            out.append(" or ".join(names))
    return out


def _version(name: str) -> str:
    try:
        module = __import__(name)
        return f"{name} {getattr(module, '__version__', '?')}"
    except ImportError:
        return f"{name} absent"


def main() -> int:
    """Run each check against one served central; print per framework trained vs reported."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=30, help="steps each framework trains (30)")
    ap.add_argument("--dry-run", action="store_true",
                    help="skip the frameworks that cannot be imported here (and say which)")  # fmt: skip
    args = ap.parse_args()
    versions = ", ".join(_version(n) for n in ("torch", "lightning", "transformers"))
    print(f"python {platform.python_version()}; {versions}")
    outcomes: list[Outcome] = []
    absent: list[tuple[str, list[str]]] = []
    with served() as central:
        print(f"central: {central.url} (SQLite, served)")
        for i, (name, needs, check) in enumerate(CHECKS):
            lacking = missing(needs)
            if lacking:
                absent.append((name, lacking))
                print(f"{name}: SKIPPED ({', '.join(lacking)} not importable)")
                continue
            job_id = f"manual:progress-check-{i}"
            register(central, job_id)
            _as_job(central, job_id)
            try:
                trained = check(args.steps)
            except Exception as exc:  # a framework's failure is this check's, not the others'
                outcomes.append(Outcome(name, 0, None, f"failed: {type(exc).__name__}: {exc}"))
                print(f"{name}: FAILED ({type(exc).__name__}: {exc})")
                continue
            got = reported(central, job_id)
            outcome = Outcome(name, trained, got)
            outcomes.append(outcome)
            print(
                f"{name}: trained {trained} steps; central reports {got} "
                f"({'same' if outcome.ok else 'DIFFERS'}; job {job_id})"
            )
    bad = [o for o in outcomes if not o.ok]
    if bad:
        print(f"FAIL: {len(bad)} of {len(outcomes)} checks differ")
        return 1
    if absent and not args.dry_run:
        print(f"FAIL: {len(absent)} frameworks missing (--dry-run skips them)")
        return 2
    print(f"OK: {len(outcomes)} checks, central reports the steps trained"
          + (f"; skipped {len(absent)}" if absent else ""))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
