"""Report a training job's progress to GPU Warden from the job itself (issue 46).

``ProgressReporter`` keeps the job's running total of steps, samples or tokens, and a background
thread sends it to ``POST /api/v1/jobs/{id}/progress`` at most every ``every_seconds``; nothing it
does raises into the training loop. ``LightningProgressCallback`` (PyTorch Lightning) and
``TrainerProgressCallback`` (Hugging Face Transformers) drive one from the trainer's hooks; they
import their framework only when first used, so this module needs neither.

Where it sends, and as which job, comes from the environment as the node agent attributes jobs:
``GPUWARDEN_CENTRAL_URL``, ``GPUWARDEN_API_TOKEN`` (an agent token of the job's node, or an
admin token), and the job id from ``GPUWARDEN_JOB_ID``, else ``slurm:$SLURM_JOB_ID``, else
``k8s:<namespace>/<pod>`` in a pod (``POD_NAMESPACE`` or the service account's namespace file,
``POD_NAME`` or ``HOSTNAME``).
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

from service.vocabulary import PROGRESS_UNITS, ProgressUnit

log = logging.getLogger(__name__)

NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# Answers after which the same reading is never sent again (the others are retried).
_REFUSED = {400, 409, 413, 422}
_STOP = {401, 403}


def job_id_from_env(
    env: Mapping[str, str] | None = None, namespace_file: Path = NAMESPACE_FILE
) -> str | None:
    """The job id the node agent gives this process's job, from ``env`` (default os.environ):
    GPUWARDEN_JOB_ID, else ``slurm:<SLURM_JOB_ID>``, else ``k8s:<namespace>/<pod>``; None when
    none of them is set."""
    env = os.environ if env is None else env
    if env.get("GPUWARDEN_JOB_ID"):
        return env["GPUWARDEN_JOB_ID"]
    if env.get("SLURM_JOB_ID"):
        return f"slurm:{env['SLURM_JOB_ID']}"
    pod = env.get("POD_NAME") or (
        env.get("HOSTNAME") if env.get("KUBERNETES_SERVICE_HOST") else None
    )
    if not pod:
        return None
    namespace = env.get("POD_NAMESPACE")
    if not namespace:
        try:
            namespace = namespace_file.read_text().strip()
        except OSError:
            namespace = None
    return f"k8s:{namespace}/{pod}" if namespace else f"k8s:{pod}"


def _is_secondary_rank(env: Mapping[str, str]) -> bool:
    """Whether this process is a rank other than 0 of a distributed job (RANK set and not 0)."""
    rank = env.get("RANK")
    return rank is not None and rank.strip() not in ("", "0")


@dataclass(frozen=True, slots=True)
class _Total:
    """The running total and the wall-clock time (Unix seconds) it was read."""

    value: float
    at_unix: float


class ProgressReporter:
    """A job's progress counter that a training loop moves (``advance``, ``set``) and a
    background thread sends at most every ``every_seconds``; never raises into the caller."""

    def __init__(
        self,
        unit: ProgressUnit = "steps",
        *,
        start: float = 0.0,
        every_seconds: float = 30.0,
        job_id: str | None = None,
        central_url: str | None = None,
        token: str | None = None,
        timeout_seconds: float = 5.0,
        background: bool = True,
        client: httpx.Client | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if env is None else env
        self.unit: ProgressUnit = unit if unit in PROGRESS_UNITS else "steps"
        if unit not in PROGRESS_UNITS:
            log.warning(
                "gpuwarden progress: unit %r is none of %s; using steps", unit, PROGRESS_UNITS
            )
        self.every_seconds = max(float(every_seconds), 1.0)
        self.job_id = job_id or job_id_from_env(env)
        url = central_url or env.get("GPUWARDEN_CENTRAL_URL")
        token = token or env.get("GPUWARDEN_API_TOKEN")
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()  # one send at a time: the thread's or a flush
        self._total = _Total(float(start), time.time())
        self._sent: _Total | None = None
        self._last_send_monotonic: float | None = None
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.sent_count = 0
        self.enabled = bool(self.job_id and url and token) and not _is_secondary_rank(env)
        self._client: httpx.Client | None = None
        if not self.enabled:
            if not _is_secondary_rank(env):
                log.warning(
                    "gpuwarden progress: not reporting (needs GPUWARDEN_CENTRAL_URL, "
                    "GPUWARDEN_API_TOKEN and a job id: GPUWARDEN_JOB_ID, SLURM_JOB_ID or a pod)"
                )
            return
        self._client = client or httpx.Client(
            base_url=str(url), timeout=timeout_seconds, headers={"Authorization": f"Bearer {token}"}
        )
        self._path = f"/api/v1/jobs/{quote(str(self.job_id), safe=':/')}/progress"
        if background:
            self._thread = threading.Thread(
                target=self._run, name="gpuwarden-progress", daemon=True
            )
            self._thread.start()

    # --- what the training loop calls -------------------------------------------------

    def advance(self, n: float = 1) -> None:
        """Add ``n`` units to the running total (a negative or non-finite ``n`` is ignored)."""
        try:
            if not math.isfinite(n) or n < 0:
                return
            now = time.time()
            with self._lock:
                self._total = _Total(self._total.value + n, now)
        except Exception:  # never into the training loop
            log.debug("gpuwarden progress: advance(%r) ignored", n, exc_info=True)

    def set(self, total: float) -> None:
        """Set the running total to ``total`` (one below the last is refused by central)."""
        try:
            if not math.isfinite(total) or total < 0:
                return
            now = time.time()
            with self._lock:
                self._total = _Total(float(total), now)
        except Exception:  # never into the training loop
            log.debug("gpuwarden progress: set(%r) ignored", total, exc_info=True)

    @property
    def total(self) -> float:
        """The running total now."""
        return self._total.value

    def flush(self) -> None:
        """Send the running total now if it changed since the last send."""
        self.send_due(now_monotonic=None)

    def close(self) -> None:
        """Send the last total and stop the thread; the reporter does nothing after."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._client is not None:
            try:
                self._client.close()
            except Exception:
                log.debug("gpuwarden progress: close failed", exc_info=True)

    def __enter__(self) -> ProgressReporter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- sending ---------------------------------------------------------------------

    def send_due(self, now_monotonic: float | None) -> bool:
        """Send the total if it changed and, where ``now_monotonic`` is given, ``every_seconds``
        have passed since the last send; True when a reading was accepted."""
        with self._send_lock:
            if not self.enabled or self._closed or self._client is None:
                return False
            with self._lock:
                total = self._total
            if self._sent is not None and total.value == self._sent.value:
                return False
            last = self._last_send_monotonic
            if (
                now_monotonic is not None
                and last is not None
                and now_monotonic - last < self.every_seconds
            ):
                return False
            self._last_send_monotonic = time.monotonic() if now_monotonic is None else now_monotonic
            return self._post(total)

    def _post(self, total: _Total) -> bool:
        at = datetime.fromtimestamp(total.at_unix, UTC).isoformat().replace("+00:00", "Z")
        body = {"unit": self.unit, "value": total.value, "at": at}
        try:
            assert self._client is not None
            r = self._client.post(self._path, json=body)
        except Exception as exc:  # a network error: the next round tries again
            log.warning("gpuwarden progress: %s unreachable (%s); will retry", self._path, exc)
            return False
        if r.status_code < 300:
            self._sent = total
            self.sent_count += 1
            return True
        detail = r.text[:300]
        if r.status_code in _STOP:
            log.warning(
                "gpuwarden progress: %s refused the token (%s); stopping", r.status_code, detail
            )
            self.enabled = False
        elif r.status_code in _REFUSED:
            log.warning("gpuwarden progress: reading refused (%s): %s", r.status_code, detail)
            self._sent = total  # this total is not sent again
        else:
            log.warning("gpuwarden progress: central answered %s; will retry", r.status_code)
        return False

    def _run(self) -> None:
        while not self._closed:
            try:
                self.send_due(now_monotonic=time.monotonic())
            except Exception:  # the thread outlives any one failure
                log.warning("gpuwarden progress: send failed", exc_info=True)
            self._wake.wait(min(self.every_seconds, 5.0))


# --- trainer callbacks, built on first use ------------------------------------------------


class _CallbackBase:
    """What both callbacks share: a reporter (given, or made on the first hook) and the total
    as the trainer's global step times ``per_step`` units."""

    def __init__(
        self,
        reporter: ProgressReporter | None = None,
        *,
        unit: ProgressUnit = "steps",
        per_step: float = 1.0,
        **reporter_options: Any,
    ) -> None:
        super().__init__()
        self.reporter = reporter
        self.unit: ProgressUnit = unit
        self.per_step = per_step
        self._options = reporter_options

    def _report(self, global_step: float, *, primary: bool) -> None:
        try:
            if not primary:
                return
            if self.reporter is None:
                self.reporter = ProgressReporter(self.unit, **self._options)
            self.reporter.set(float(global_step) * self.per_step)
        except Exception:  # never into the training loop
            log.debug("gpuwarden progress: callback failed", exc_info=True)

    def _close(self) -> None:
        if self.reporter is not None:
            self.reporter.close()


class _LightningHooks(_CallbackBase):
    """Lightning's hooks: the global step at the start, after each batch and at the end (rank 0)."""

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Send the step training starts from (0, or where a resumed run picks up)."""
        self._report(trainer.global_step, primary=bool(getattr(trainer, "is_global_zero", True)))
        if self.reporter is not None:
            self.reporter.flush()

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Move the total to the trainer's global step."""
        self._report(trainer.global_step, primary=bool(getattr(trainer, "is_global_zero", True)))

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Send the last total."""
        self._report(trainer.global_step, primary=bool(getattr(trainer, "is_global_zero", True)))
        self._close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Send what was done before the failure."""
        self._close()


class _TrainerHooks(_CallbackBase):
    """Hugging Face Trainer's hooks: ``state.global_step`` at the start, after each optimizer
    step and at the end, from the main process only."""

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Send the step training starts from (0, or where a resumed run picks up)."""
        self._report(state.global_step, primary=bool(getattr(state, "is_world_process_zero", True)))
        if self.reporter is not None:
            self.reporter.flush()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Move the total to the trainer's global step."""
        self._report(state.global_step, primary=bool(getattr(state, "is_world_process_zero", True)))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Send the last total."""
        self._report(state.global_step, primary=bool(getattr(state, "is_world_process_zero", True)))
        self._close()


def _lightning_base() -> type:
    """Lightning's ``Callback`` (``lightning.pytorch``, else the older ``pytorch_lightning``)."""
    try:
        module = importlib.import_module("lightning.pytorch")
    except ImportError:
        module = importlib.import_module("pytorch_lightning")
    base: type = module.Callback
    return base


def _transformers_base() -> type:
    """Transformers' ``TrainerCallback``."""
    base: type = importlib.import_module("transformers").TrainerCallback
    return base


_BUILT: dict[str, type] = {}


def __getattr__(name: str) -> type:
    """``LightningProgressCallback`` and ``TrainerProgressCallback``, each a subclass of its
    framework's callback class, built (and the framework imported) on first use."""
    if name == "LightningProgressCallback":
        if name not in _BUILT:
            _BUILT[name] = type(
                name, (_LightningHooks, _lightning_base()), {"__module__": __name__}
            )
        return _BUILT[name]
    if name == "TrainerProgressCallback":
        if name not in _BUILT:
            _BUILT[name] = type(
                name, (_TrainerHooks, _transformers_base()), {"__module__": __name__}
            )
        return _BUILT[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
