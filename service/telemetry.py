"""The central service's own health metrics, in a registry per app (nothing global)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry

from service.families import OwnRegistry

# The label values each labelled counter starts with, at 0 (service/families.py says why).
INGEST_OUTCOMES: tuple[str, ...] = ("stored", "rejected", "refused", "error")
# Database operations counted by the API (background tasks add their own names, see ``task``).
DB_OPERATIONS: tuple[str, ...] = ("ingest", "metrics", "readyz", "statement_timeout", "unavailable")
# skipped: a tick came while the task's previous run was still busy (it is falling behind);
# elsewhere: another replica held the task's turn (or every shard of it), so this one had none.
TASK_OUTCOMES: tuple[str, ...] = ("ok", "error", "skipped", "elsewhere")
NOTIFY_OUTCOMES: tuple[str, ...] = ("sent", "retry", "failed")


# The rounds that set stored rows aside, and where a job conflict comes from (their label values).
SET_ASIDE_ROUNDS = ("rollup", "evaluate", "deliver")
JOB_CONFLICT_SOURCES = ("api", "observed")


class Telemetry(OwnRegistry):
    """Counters and histograms the service updates as it works; exposed on /metrics."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        counter, gauge, histogram = self.counter, self.gauge, self.histogram
        self.ingest_batches = counter(
            "gpuwarden_ingest_batches",
            "Ingest batches by outcome (stored; rejected; refused: busy or client gone; error).",
            ["outcome"],
            zero=INGEST_OUTCOMES,
        )
        self.ingest_samples = counter(
            "gpuwarden_ingest_samples", "Samples received in stored batches."
        )
        self.ingest_values = counter(
            "gpuwarden_ingest_metric_values", "Metric values received in stored batches."
        )
        self.ingest_seconds = histogram(
            "gpuwarden_ingest_batch_duration_seconds",
            "Time to validate and store one ingest batch.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
        )
        self.gpu_moves = counter(
            "gpuwarden_gpu_moves",
            "GPUs moved to the node that reported them (their old node no longer did).",
        )
        self.ingest_gpus_refused = counter(
            "gpuwarden_ingest_gpus_refused",
            "GPUs left out of a batch because another node still reports them.",
        )
        self.db_errors = counter(
            "gpuwarden_database_errors",
            "Database operations that failed, by operation.",
            ["operation"],
            zero=DB_OPERATIONS,
        )
        # "task", not "job": Prometheus owns the job label of every scraped series.
        self.job_runs = counter(
            "gpuwarden_background_job_runs",
            "Background job runs by task and outcome.",
            ["task", "outcome"],
        )
        self.job_seconds = histogram(
            "gpuwarden_background_job_duration_seconds",
            "Duration of background job runs (seconds).",
            ["task"],
        )
        self.set_aside_rows = counter(
            "gpuwarden_set_aside_rows",
            "Stored rows a background round could not use and left out, by round (rollup,"
            " evaluate, deliver); each is logged with which row and why.",
            ["round"],
            zero=SET_ASIDE_ROUNDS,
        )
        self.job_conflicts = counter(
            "gpuwarden_job_conflicts",
            "Claims of a node on a job that disagreed with the job (a squatted or hijacked id),"
            " refused and recorded on the job, by source (api: the node's POST or PATCH;"
            " observed: its process hints).",
            ["source"],
            zero=JOB_CONFLICT_SOURCES,
        )
        self.rollup_buckets = counter(
            "gpuwarden_rollup_buckets_recomputed",
            "One-minute rollup buckets recomputed from raw samples.",
        )
        # --- alerting ------------------------------------------------------------------
        self.reports = counter(
            "gpuwarden_reports",
            "Periodic reports by outcome (queued; opted_out; no_jobs: skipped, nothing ran).",
            ["outcome"],
        )
        self.notifications = counter(
            "gpuwarden_notifications",
            "Notification delivery attempts by channel and outcome (sent, retry, failed).",
            ["channel", "outcome"],
        )
        self.outbox_depth = gauge(
            "gpuwarden_outbox_depth", "Notifications queued and not yet delivered."
        )
        self.policy_failures = counter(
            "gpuwarden_policy_evaluation_failures",
            "Evaluation rounds in which a policy raised and was skipped (the others went on).",
            ["policy"],
        )
        self.evaluation_seconds = histogram(
            "gpuwarden_evaluation_duration_seconds",
            "Time to evaluate every policy once.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.evaluator_leader = gauge(
            "gpuwarden_evaluator_leader",
            "1 while this replica holds the evaluator lock (evaluates and sends), else 0.",
        )
        self.alerts_firing = gauge(
            "gpuwarden_alerts_firing", "Alerts firing now, by severity.", ["severity"]
        )

    def task(self, name: str) -> None:
        """Start background task ``name``'s run and database-error counters at 0."""
        for outcome in TASK_OUTCOMES:
            self.job_runs.labels(name, outcome)
        self.db_errors.labels(name)

    def policy(self, name: str, channels: Iterable[str]) -> None:
        """Start policy ``name``'s failure counter and its channels' delivery counters at 0."""
        self.policy_failures.labels(name)
        for channel in channels:
            for outcome in NOTIFY_OUTCOMES:
                self.notifications.labels(channel, outcome)
