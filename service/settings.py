"""Settings for the central service and the agent, read from ``GPUWARDEN_*`` variables."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.clientsettings import (
    DEFAULT_DATABASE_URL,
    ENV_PREFIX,
    ClientSettings,
    normalize_database_url,
)
from service.configfile import CONFIG_KEYS as CONFIG_KEYS
from service.configfile import expand_env as expand_env
from service.configfile import load_config_file as load_config_file
from service.delivery import webhook_key_problem

GIB = 1024**3
# A Kubernetes label key: an optional DNS-1123 subdomain prefix and '/', then a name of at most 63.
_LABEL_KEY = (
    r"^(?:[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?/)?"
    r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


# Standard Webhooks recommends 24 to 64 random bytes: a shorter key can be guessed offline
# from one signed request, and a forged reclaim frees (kills) GPUs.
MIN_ACTION_KEY_BYTES = 24


def _short_key_problem(key: str) -> str | None:
    """Why the whsec_ ``key`` (already valid base64) is too short to sign reclaims, or None."""
    import base64

    size = len(base64.b64decode(key[len("whsec_") :]))
    if size >= MIN_ACTION_KEY_BYTES:
        return None
    return (
        f"GPUWARDEN_ACTION_WEBHOOK_SECRET decodes to {size} bytes; it needs at least "
        f"{MIN_ACTION_KEY_BYTES} random bytes (whsec_ + base64 of 24 to 64 bytes, such as "
        "openssl rand -base64 32)"
    )


class Settings(BaseSettings):
    """Every setting of GPU Warden; built once by the entry point and passed down."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", populate_by_name=True)

    # --- central service -------------------------------------------------------------
    database_url: str = DEFAULT_DATABASE_URL
    # PostgreSQL's own databases (postgres, template0/1) are refused unless this is set: a
    # URL that names the server's maintenance database would put GPU Warden's tables there.
    database_allow_maintenance: bool = False
    # Optional read-only URL (a PostgreSQL streaming replica): GET routes, the console, reports
    # and /metrics read there, writes and background rounds use database_url (docs/operations.md).
    database_read_url: str | None = None
    # A replica further behind than this (seconds) is skipped: its reads go to the primary.
    database_read_max_lag_seconds: float = Field(10.0, ge=0)
    # How often the replica's lag is measured, and how long a replica that failed is left alone.
    database_read_check_seconds: float = Field(5.0, gt=0)
    database_read_connect_timeout_seconds: int = Field(2, ge=1)
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    config: Path | None = None  # optional YAML file with policies, channels and prices
    log_level: str = ClientSettings.log_level

    max_gap_seconds: float = Field(60.0, gt=0)
    # /metrics keeps exporting a GPU whose latest sample is this old (late data, ingest behind),
    # with gpuwarden_gpu_sample_age_seconds; past it the GPU's series end.
    metrics_keep_late_seconds: float = Field(900.0, gt=0)
    idle_threshold: float = Field(0.05, ge=0, le=1)
    held_threshold_bytes: int = Field(GIB, ge=0)
    # The causes of a running sample (service.core.diagnosis.thresholds_of reads these;
    # docs/diagnosis.md says why these values).
    # A change applies to samples stored from then on.
    cause_no_kernel_util: float = Field(0.02, ge=0, le=1)
    cause_transfer_bytes_per_second: float = Field(2e9, ge=0)
    cause_busy: float = Field(0.5, ge=0, le=1)
    cause_launch_min_util: float = Field(0.1, ge=0, le=1)
    cause_launch_fill: float = Field(0.5, ge=0, le=1)
    cause_starved_util: float = Field(0.5, ge=0, le=1)
    cause_memory_dram: float = Field(0.5, ge=0, le=1)
    cause_tensor: float = Field(0.05, ge=0, le=1)
    # Useful work (docs/diagnosis.md#useful-work-sham-and-hung): how long a keep-alive pattern
    # or a stalled resident kernel must hold before its time is called sham or hung (minutes).
    useful_work_hold_minutes: float = Field(10.0, gt=0, le=1440)

    # How a GPU shared by several jobs splits its time and cost between them (docs/costs.md):
    # equal, memory (by memory held) or activity (busy time by SM share, idle time by memory).
    # Applies to minutes rolled up from then on.
    cost_split_rule: Literal["equal", "memory", "activity"] = "equal"
    # Where GPU prices come from (docs/costs.md#no-prices-gpu-hours): "table" (the price
    # table: PUT /api/v1/prices, else the config file's prices:, else the shipped defaults)
    # or "none" (no prices: every figure is in GPU-hours, dollars are null, never $0).
    prices: Literal["table", "none"] = "table"
    # A running OpenCost (http://opencost.opencost:9003): per-node GPU prices read from its
    # /allocation/compute answer replace the price table (docs/costs.md#prices-from-opencost).
    opencost_url: str | None = None
    opencost_refresh_seconds: float = Field(3600.0, gt=0)
    opencost_window: str = "7d"

    # Proven savings (docs/savings.md): a run told a fix is checked against the next run of its
    # work key that starts within this many days of its end; a difference under the floor (a
    # share) is never a saving, whatever the key's own spread; a run that reports no progress
    # and strays this share past the key's usual length did other work.
    savings_horizon_days: float = Field(30.0, gt=0)
    savings_noise_floor: float = Field(0.05, ge=0, le=1)
    savings_length_tolerance: float = Field(0.25, ge=0)
    # Each cause's promises carry a factor learned from its pairs of the last days (from this
    # many pairs on), relearned by a background round this often.
    savings_calibration_days: float = Field(90.0, gt=0)
    savings_calibration_min_pairs: int = Field(20, ge=1)
    savings_calibration_interval_seconds: float = Field(3600.0, gt=0)
    # Each round recomputes the savings of the runs that ended in this many last days (late
    # data, a price change); older ones stay as stored.
    savings_recompute_days: float = Field(2.0, gt=0)

    ingest_max_body_bytes: int = Field(16 * 1024 * 1024, gt=0)
    # Every other route's body limit, as sent and once expanded (413 past it).
    max_body_bytes: int = Field(1024 * 1024, gt=0)
    # Request bodies held at once over all requests, as sent, expanded and parsed (503 past it;
    # one request alone always passes).
    body_memory_budget_bytes: int = Field(256 * 1024 * 1024, gt=0)
    ingest_max_future_seconds: float = Field(300.0, ge=0)
    # How far back an agent token may date the start of a job it registers (or joins).
    job_agent_max_start_age_seconds: float = Field(3600.0, gt=0)

    # --- capacity and overload control (docs/operations.md explains each) ---------------
    db_pool_size: int = Field(16, ge=1)  # connections for reads, writes and background jobs
    db_max_overflow: int = Field(4, ge=0)
    db_pool_timeout_seconds: float = Field(10.0, gt=0)  # wait for a free connection, then 503
    db_statement_timeout_seconds: float = Field(30.0, gt=0)  # PostgreSQL: longest read statement
    ingest_max_concurrent: int = Field(4, ge=1)  # batches stored at once, on their own pool
    ingest_statement_timeout_seconds: float = Field(10.0, gt=0)
    # Longest wait for an ingest slot before 503 + Retry-After; a client's X-Request-Timeout
    # header shortens it to half its timeout, and a batch is not committed past that timeout.
    ingest_wait_seconds: float = Field(5.0, gt=0)
    auth_max_concurrent_lookups: int = Field(2, ge=1)  # token lookups at once (ingest pool)
    max_concurrent_reads: int = Field(4, ge=1)  # API reads at once; more wait, then 503
    max_expensive_reads: int = Field(2, ge=1)  # cost reports, job summaries, long series
    admission_wait_seconds: float = Field(0.1, ge=0)  # how long a read waits for a slot
    auth_failure_burst: int = Field(20, ge=1)  # failed attempts a client may make at once
    auth_failure_refill_per_second: float = Field(1.0, gt=0)  # then this many a second
    # Comma-separated CIDRs whose X-Forwarded-For (client address) and X-Forwarded-Proto (https:
    # the console cookie is Secure) are believed.
    trusted_proxies: str = ""

    rollup_interval_seconds: float = Field(15.0, gt=0)
    # The rollup's work split by GPU id into this many shards, each run by one replica at a time
    # (PostgreSQL advisory lock per shard): with several central replicas, set it to their
    # number or more so they share a round instead of one replica doing it all.
    rollup_shards: int = Field(1, ge=1, le=64)
    retention_raw_days: float = Field(7.0, gt=0)
    retention_1m_days: float = Field(90.0, gt=0)
    retention_1h_days: float = Field(730.0, gt=0)
    retention_interval_seconds: float = Field(3600.0, gt=0)
    # Cost day sums: how often the cost-days job writes missing or stale (job, GPU, day) sums,
    # and how many days back it sums (older whole days are read from the rollups, as exact but
    # slower); a report reads each summed whole day from one row per job and GPU.
    cost_days_interval_seconds: float = Field(60.0, gt=0)
    cost_days_backfill_days: int = Field(92, ge=0)
    # Today so far: in a fleet of this many GPUs or more (0: any), the cost-days job also sums
    # today up to a minute cost_today_settle_seconds old (late batches have arrived by then),
    # and a report reaching the present ends there: read in a few statements, not GPU by GPU.
    cost_today_min_gpus: int = Field(1000, ge=0)
    cost_today_settle_seconds: float = Field(120.0, ge=0)

    eval_interval_seconds: float = Field(30.0, gt=0)
    webhook_allow_nets: str = ""  # comma-separated CIDRs that channel URLs may resolve to
    metrics_token_required: bool = False  # protect /metrics with a reader token
    metrics_dcgm_compat: bool = False  # also export dcgm-exporter names and labels
    run_scheduler: bool = True  # background rollups, retention and evaluation
    # How long a console login lasts (its session cookie); revoking the token ends it sooner.
    console_session_seconds: float = Field(12 * 3600.0, gt=0)
    # Single sign-on for the console (OpenID Connect, authorization code with PKCE), beside
    # tokens: set the issuer to turn it on (docs/security.md#single-sign-on).
    oidc_issuer: str | None = None  # https://sso.example.org/realms/lab (its discovery URL's base)
    oidc_client_id: str = "gpuwarden"
    oidc_client_secret: str | None = None  # unset: a public client (PKCE alone)
    oidc_scopes: str = "openid profile email groups"
    # The ID token claim naming the GPU Warden user (the name jobs carry: Slurm user, owner label).
    oidc_user_claim: str = "preferred_username"
    oidc_groups_claim: str = "groups"  # a list of group names; teams and roles come from it
    # Comma-separated groups whose people see the whole fleet (fleet-reader) or administer.
    oidc_reader_groups: str = "gpuwarden-readers"
    oidc_admin_groups: str = "gpuwarden-admins"
    # Only groups starting with this prefix name teams (the prefix cut off); empty: every other
    # group is a team.
    oidc_team_prefix: str = ""
    # Where the provider sends the browser back; default public_url + /api/v1/auth/oidc/callback.
    oidc_redirect_url: str | None = None

    # --- alerting ----------------------------------------------------------------------
    public_url: str = "http://127.0.0.1:8000"  # base of links in notifications
    # The one loopback URL a channel may post to: the notification log of `up` and `demo`.
    local_sink_url: str | None = None
    outbox_interval_seconds: float = Field(1.0, gt=0)  # how often queued notifications are sent
    notify_timeout_seconds: float = Field(10.0, gt=0)
    # Egress proxy for notifications (http://proxy:3128); unset: HTTPS_PROXY, HTTP_PROXY and
    # NO_PROXY from the environment; "direct": no proxy whatever the environment says.
    notify_proxy_url: str | None = None
    alertmanager_resend_seconds: float = Field(60.0, gt=0)  # re-send firing alerts to Alertmanager
    # --- acting on waste (the ladder) -------------------------------------------------
    # The Slurm commands a reclaim runs (split like a shell line; "sudo -n scancel" works), and
    # the one that reads a job's state first, so a finished job is never requeued.
    slurm_cancel_command: str = "scancel"
    slurm_requeue_command: str = "scontrol requeue"
    slurm_squeue_command: str = "squeue"
    # Expands a compressed node list (gpu[01-04]) to host names, to check a job's nodes.
    slurm_hostnames_command: str = "scontrol show hostnames"
    action_timeout_seconds: float = Field(30.0, gt=0)  # a driver's command or request
    action_retry_seconds: float = Field(300.0, gt=0)  # a failed reclaim is tried again after
    # The evidence a ladder step needs (docs/actions.md#safety-rules): each of the job's GPUs
    # reported in at least this share of the whole minutes since the condition began, its newest
    # sample at most this old, and its node's clock within this of the central's.
    ladder_min_coverage: float = Field(0.9, gt=0, le=1)
    ladder_max_sample_age_seconds: float = Field(180.0, gt=0)
    ladder_max_clock_offset_seconds: float = Field(30.0, gt=0)
    # How many reclaims one round sends at once (each may wait action_timeout_seconds).
    ladder_parallel_reclaims: int = Field(8, ge=1, le=64)
    # The Kubernetes API the Kubernetes driver calls: this kubeconfig file (and one of its
    # contexts), else the central pod's own service account (deploy/kubernetes/components/
    # reclaim ships it with the RBAC the driver needs).
    kubernetes_kubeconfig: Path | None = None
    kubernetes_context: str | None = None
    # The Namespace label whose value is the team (the account) a pod is charged to, which team
    # exemptions trust (cluster admins set namespace labels, not the pod's owner); and the pod
    # label naming the pod's owner, checked against the job's user (unset: no owner is read).
    kubernetes_team_label: str = Field("team", pattern=_LABEL_KEY)
    kubernetes_user_label: str | None = Field(None, pattern=_LABEL_KEY)
    # The action webhook (the "webhook" driver): where a reclaim is POSTed, signed with this
    # Standard Webhooks key (whsec_...); unset, ladders have no webhook driver.
    action_webhook_url: str | None = None
    action_webhook_secret: str | None = None
    # --- owners: e-mail, Slack direct messages, the directory's lookup command ---------
    # The SMTP server owner notices and e-mail channels send through (docs/actions.md): unset
    # host, no e-mail is sent. smtp_tls: starttls (upgrade on the port, 587), tls (implicit TLS
    # from the first byte, 465) or none (loopback relays only). User and password come from
    # GPUWARDEN_SMTP_USER / GPUWARDEN_SMTP_PASSWORD; both unset: no login.
    smtp_host: str | None = None
    smtp_port: int = Field(587, ge=1, le=65535)
    smtp_tls: Literal["starttls", "tls", "none"] = "starttls"
    smtp_user: str | None = None
    smtp_password: str | None = None
    smtp_from: str = "GPU Warden <gpuwarden@localhost>"
    smtp_timeout_seconds: float = Field(10.0, gt=0)
    # The CA bundle the SMTP server's certificate is checked against (a site's own CA); unset:
    # the system's. The host name is always checked.
    smtp_ca_file: Path | None = None
    # How long the record of what was sent to people (GET /api/v1/notices) is kept, in days.
    notices_retention_days: float = Field(400.0, gt=0)
    # The Slack bot token (xoxb-...) of slack_dm channels: chat.postMessage to a user id.
    slack_bot_token: str | None = None
    # A command that finds a user missing from the directory, e.g. "getent passwd {user}"
    # (split like a shell line, {user} one argument, never run by a shell); its output is
    # read by owner_lookup_pattern, a regular expression with named groups email, slack,
    # team and cc_email; the answer (or its absence) is cached this long.
    owner_lookup_command: str | None = None
    # The default takes the first e-mail address anywhere in the output (a GECOS field of
    # `getent passwd` that holds one, an LDAP ``mail:`` line).
    owner_lookup_pattern: str = r"(?P<email>[^\s:,;<>]+@[^\s:,;<>]+\.[^\s:,;<>]+)"
    owner_lookup_timeout_seconds: float = Field(5.0, gt=0)
    owner_lookup_ttl_seconds: float = Field(3600.0, gt=0)
    # --- costs and reports -------------------------------------------------------------
    # Recommendations (service.costs.recommend; service.costs.assumptions.fix_assumptions_of
    # reads these and the cause_* thresholds above; docs/diagnosis.md gives the sources): how
    # many times faster matrix maths runs on tensor cores, and a DRAM-bound kernel with fewer
    # bytes.
    fix_tensor_speedup: float = Field(4.0, ge=1)
    fix_memory_speedup: float = Field(2.0, ge=1)
    # A GPU of a multi-GPU job idle this share of its time is one the job could give back.
    rightsize_idle_gpu_fraction: float = Field(0.8, gt=0, le=1)
    # A MIG slice fits when the job's peak memory is at most this share of the slice's memory.
    rightsize_mig_memory_headroom: float = Field(0.9, gt=0, le=1)
    # A cost report reads its spans' edges from raw samples (exact) when at most this many
    # spans have an edge raw retention holds; beyond, pro rata from the edge's 1m bucket (at
    # most a minute per edge) keeps a fleet-wide report within its second. 2,500 such spans
    # (a 200-GPU fleet's month) cost about 0.1 s; 11,500 (1,000 GPUs) 0.6-0.9 s.
    report_raw_edge_spans: int = Field(2500, ge=0)
    # Electricity: USD per kWh the GPUs' energy is priced at (0.12: a typical US industrial
    # rate plus cooling overhead; set your own).
    energy_usd_per_kwh: float = Field(0.12, ge=0)
    # --- periodic reports (docs/reports.md) --------------------------------------------
    # Each user's, team's and the admins' report of the period that ended: weekly (Monday
    # 00:00 UTC to Monday) or daily (UTC midnights); off sends none.
    report_period: Literal["weekly", "daily", "off"] = "weekly"
    # A period of this many seconds instead (counted from a Monday midnight UTC): for trying
    # reports out, or tests that cross a period's end.
    report_period_seconds: float | None = Field(None, gt=0)
    # How long after a period's end its reports wait, so late batches and rollups are in.
    report_delay_seconds: float = Field(900.0, ge=0)
    report_interval_seconds: float = Field(60.0, gt=0)  # how often the leader looks for one due
    # Comma-separated channel names that receive every report (user, team and admins').
    report_channels: str = ""
    # Also send each report to its recipient's own addresses in the owner directory (through
    # the email and slack_dm channels, when there are such).
    report_to_owners: bool = True
    # A user or team that ran no job in the period: a one-line report (line) or none (skip).
    report_no_jobs: Literal["line", "skip"] = "line"
    report_top_jobs: int = Field(3, ge=0, le=20)  # the costliest jobs a report lists
    report_worst: int = Field(5, ge=0, le=10)  # the worst users and teams the admins' lists
    # The reader token the CLI sends to central_url (the CLI reads it as ClientSettings).
    api_token: str | None = ClientSettings.api_token

    # --- agent -----------------------------------------------------------------------
    central_url: str = ClientSettings.central_url
    agent_token: str | None = None
    interval_seconds: float = Field(10.0, ge=0.1)
    backend: Literal["auto", "nvml", "dcgm-exporter", "simulated"] = "auto"
    spool_path: Path | None = None  # default: spool.sqlite in the state directory
    dcgm_exporter_url: str = "http://127.0.0.1:9400/metrics"

    # --- agent: node identity --------------------------------------------------------
    # The node the agent reports: GPUWARDEN_NODE_NAME, else NODE_NAME (the downward API's
    # spec.nodeName, as dcgm-exporter reads it), else the machine's own short hostname.
    node_name: str | None = Field(
        None, validation_alias=AliasChoices("GPUWARDEN_NODE_NAME", "NODE_NAME", "node_name")
    )
    node_labels: str = ""  # comma-separated key=value pairs sent with every batch
    agent_metrics_port: int | None = Field(None, ge=1, le=65535)  # the agent's own /metrics
    agent_metrics_host: str = "127.0.0.1"
    spool_max_bytes: int = Field(256 * 1024 * 1024, gt=0)
    agent_batch_seconds: float = Field(30.0, ge=0)  # ship polls together, one request per batch
    dead_letter_path: Path | None = None  # default: dead-letter.jsonl in the state directory
    # Where the Slurm epilog leaves job ends for the agent to ship (default: job-ends in the
    # state directory; the epilog reads the same setting from agent.env).
    job_end_dir: Path | None = None
    # Every agent state file lives here: this, else $STATE_DIRECTORY (systemd), else
    # $XDG_STATE_HOME/gpuwarden, else ./gpuwarden-data (service/collectors/state_dir.py).
    state_dir: Path | None = ClientSettings.state_dir
    proc_root: Path = Path("/proc")  # the host's /proc (mount it into an agent container)
    # The kubelet's pod-resources socket: GPU -> pod on Kubernetes (used when it exists).
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    job_map_dir: Path | None = None  # dcgm-exporter-style job mapping dir: a file per GPU index
    observed_job_grace_seconds: float = Field(300.0, gt=0)  # central: close unseen intervals
    observed_jobs_interval_seconds: float = Field(30.0, gt=0)

    @field_validator("database_url", "database_read_url")
    @classmethod
    def _check_database_url(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None or (value == "" and info.field_name == "database_read_url"):
            return None  # an empty GPUWARDEN_DATABASE_READ_URL: no replica
        if not re.match(r"^(sqlite|postgresql)(\+\w+)?://", value):
            raise ValueError("must start with sqlite:// or postgresql+psycopg://")
        if info.field_name == "database_read_url" and not value.startswith("postgres"):
            raise ValueError("a read replica is a PostgreSQL streaming replica: postgresql://")
        return normalize_database_url(value)

    @field_validator("opencost_url")
    @classmethod
    def _check_opencost_url(cls, value: str | None) -> str | None:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("must be OpenCost's API as an http:// or https:// URL")
        return value or None

    @field_validator("action_webhook_url")
    @classmethod
    def _check_action_webhook_url(cls, value: str | None) -> str | None:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value or None

    @field_validator("action_webhook_secret")
    @classmethod
    def _check_action_webhook_secret(cls, value: str | None) -> str | None:
        problem = webhook_key_problem(value) if value else None
        if problem is None and value:
            problem = _short_key_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value or None

    @model_validator(mode="after")
    def _action_webhook_is_signed(self) -> Settings:
        if self.action_webhook_url and not self.action_webhook_secret:
            # An unsigned request to free GPUs could be forged by anyone who can reach the URL.
            raise ValueError(
                "action_webhook_secret: GPUWARDEN_ACTION_WEBHOOK_URL needs "
                "GPUWARDEN_ACTION_WEBHOOK_SECRET (whsec_...): an action webhook is always signed"
            )
        return self

    @model_validator(mode="after")
    def _replica_of_postgresql(self) -> Settings:
        if self.database_read_url and self.is_sqlite:
            raise ValueError(
                "database_read_url: a read replica follows a PostgreSQL primary; "
                "GPUWARDEN_DATABASE_URL is SQLite"
            )
        return self

    @property
    def is_sqlite(self) -> bool:
        """Whether the store is the embedded SQLite database."""
        return self.database_url.startswith("sqlite")
