"""The policy and channel schema, shared by the YAML file and the REST API."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from service.core.diagnosis import CAUSE_BY_NAME, CAUSE_MEANING, WASTE_CAUSES, Cause
from service.core.durations import parse_duration, spec_duration
from service.core.job_ids import control_problem
from service.delivery import webhook_key_problem
from service.errors import ValidationFailed
from service.thresholds.ladder import LadderSpec
from service.vocabulary import LABEL_ALIASES, METRICS_BY_NAME, WHERE_LABELS, canonical_labels

CAUSE_PREFIX = "cause:"
# ``idle_held`` is ``cause:idle_held`` under its first name, kept so written policies stay valid:
# one metric, read and described the same way under either name.
IDLE_HELD_METRIC = "idle_held"

# Metrics derived per sample from the decision stored with it at ingest, beside the canonical
# ones: activity is the ladder (sm_active, else gr_engine_active, else gpu_util); idle_held is
# 1 while nothing runs with memory held, else 0; cause:<name> is 1 while the sample's cause is
# <name> (over a window: the share of covered time in it); hardware_fault is 1 when, in the
# window, the GPU reported a hardware XID (vocabulary's HARDWARE_XIDS; application XIDs such as
# 13, 31, 43 do not count) or a row-remap failure, its uncorrectable remapped rows or PCIe
# replays rose, or it has fallen off the bus.
DERIVED_METRICS: dict[str, str] = {
    "activity": "the activity ratio: sm_active, else gr_engine_active, else gpu_util",
    IDLE_HELD_METRIC: "1 while nothing runs (no kernel, activity below idle) with memory held, "
    "else 0",
    "hardware_fault": "1 when, in the window, the GPU reported a hardware XID or a row-remap "
    "failure, its uncorrectable remapped rows or PCIe replays rose, or it is lost; else 0",
    **{f"{CAUSE_PREFIX}{c.label}": f"share of covered time that is {c.label}: {CAUSE_MEANING[c]}"
       for c in Cause},
}  # fmt: skip
# Metrics of a node rather than of its samples: silent_seconds is how long ago the node last
# reported (its latest batch or GPU sample), read from the node's last sign of life, not from
# a window of samples, so it has a value exactly when the samples stop.
SILENT_SECONDS = "silent_seconds"
NODE_METRICS: dict[str, str] = {
    SILENT_SECONDS: "seconds since the node last reported (scope node; window: how long a "
    "silent node stays watched before it counts as gone)",
}
POLICY_METRICS: tuple[str, ...] = (*METRICS_BY_NAME, *DERIVED_METRICS, *NODE_METRICS)
# The metrics read from windows of samples.
SAMPLE_METRICS: tuple[str, ...] = (*METRICS_BY_NAME, *DERIVED_METRICS)


def metric_range(metric: str) -> tuple[float, float | None, str]:
    """The (lowest, highest or None, unit) values ``metric`` can take; derived metrics are 0..1."""
    if metric in NODE_METRICS:
        return 0.0, None, "seconds"
    spec = METRICS_BY_NAME.get(metric)
    if spec is None:
        return 0.0, 1.0, "ratio"
    return spec.minimum, spec.maximum, spec.unit


def cause_of_metric(metric: str) -> Cause | None:
    """The cause a ``cause:<name>`` policy metric (or ``idle_held``) names, else None."""
    if metric == IDLE_HELD_METRIC:
        return Cause.IDLE_HELD
    if not metric.startswith(CAUSE_PREFIX):
        return None
    return CAUSE_BY_NAME.get(metric[len(CAUSE_PREFIX) :])


MATCH_LABELS: tuple[str, ...] = WHERE_LABELS
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"

Op = Literal["<", "<=", ">", ">="]
Aggregate = Literal["avg", "max", "min"]
Scope = Literal["gpu", "node", "job"]
Severity = Literal["info", "warning", "critical"]
# The examples a refused window, for or repeat interval names.
_LIKE = "30s, 15m or 4h"


class PolicySpec(BaseModel):
    """A threshold policy: alert when ``aggregate(metric over window) op threshold`` for ``for``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(pattern=NAME_PATTERN)
    metric: str
    aggregate: Aggregate = "avg"
    window: str = "5m"
    op: Op
    threshold: float = Field(allow_inf_nan=False)
    for_: str = Field("0s", alias="for")
    scope: Scope = "gpu"
    match: dict[str, str] = Field(default_factory=dict)
    severity: Severity = "warning"
    channels: list[str] = Field(default_factory=list)
    repeat_interval: str = "4h"
    send_resolved: bool = Field(True, strict=True)  # true or false, never 0 or "yes"
    description: str | None = None
    # Warn the job's owner, then reclaim its GPUs, while the condition holds (job or gpu scope).
    ladder: LadderSpec | None = None

    # Derived once: the evaluator reads these for every scope key of every round.
    _window_s: float = PrivateAttr(0.0)
    _for_s: float = PrivateAttr(0.0)
    _repeat_s: float = PrivateAttr(0.0)
    _low_util: bool = PrivateAttr(False)

    def model_post_init(self, context: Any, /) -> None:
        """Parse the durations and classify the policy once."""
        self._window_s = parse_duration(self.window)
        self._for_s = parse_duration(self.for_)
        self._repeat_s = parse_duration(self.repeat_interval)
        spec = METRICS_BY_NAME.get(self.metric)
        cause = cause_of_metric(self.metric)
        ratio = self.metric == "activity" or (spec is not None and spec.unit == "ratio")
        self._low_util = (
            self.metric == IDLE_HELD_METRIC
            or (ratio and self.op in ("<", "<="))
            or (cause in WASTE_CAUSES and self.op in (">", ">="))
        )

    @field_validator("metric")
    @classmethod
    def _metric(cls, value: str) -> str:
        if value not in POLICY_METRICS:
            raise ValueError(f"unknown metric {value!r}; known: {', '.join(POLICY_METRICS)}")
        return value

    @field_validator("window")
    @classmethod
    def _window(cls, value: Any) -> str:
        return spec_duration("window", value, allow_zero=False, like=_LIKE)

    @field_validator("for_", mode="before")
    @classmethod
    def _for(cls, value: Any) -> str:
        return spec_duration("for", value, allow_zero=True, like=_LIKE)

    @field_validator("repeat_interval", mode="before")
    @classmethod
    def _repeat(cls, value: Any) -> str:
        return spec_duration("repeat_interval", value, allow_zero=False, like=_LIKE)

    @model_validator(mode="after")
    def _node_metric_on_nodes(self) -> PolicySpec:
        if self.metric in NODE_METRICS and self.scope != "node":
            raise ValueError(f"scope: {self.metric} is a node's metric; write scope: node")
        return self

    @model_validator(mode="after")
    def _ladder_on_jobs(self) -> PolicySpec:
        if self.ladder is not None and self.scope == "node":
            raise ValueError(
                "ladder: a node policy has no job to act on; write scope: job or scope: gpu"
            )
        return self

    @model_validator(mode="after")
    def _threshold_in_range(self) -> PolicySpec:
        low, high, unit = metric_range(self.metric)
        if self.threshold < low or (high is not None and self.threshold > high):
            span = f"{low:g}..{high:g}" if high is not None else f"at least {low:g}"
            hint = ""
            if unit == "ratio" and 1 < self.threshold <= 100:
                hint = f"; a ratio: write {self.threshold / 100:g} for {self.threshold:g}%"
            raise ValueError(
                f"threshold: {self.threshold:g} is outside {self.metric}'s range {span} "
                f"({unit}){hint}"
            )
        return self

    @field_validator("match")
    @classmethod
    def _match(cls, value: dict[str, str]) -> dict[str, str]:
        for label in value:
            if label not in MATCH_LABELS and label not in LABEL_ALIASES:
                raise ValueError(f"cannot match on label {label!r}; use {', '.join(MATCH_LABELS)}")
        return canonical_labels(value)

    @property
    def window_seconds(self) -> float:
        """The aggregation window in seconds."""
        return self._window_s

    @property
    def for_seconds(self) -> float:
        """How long the condition must hold before the alert fires, in seconds."""
        return self._for_s

    @property
    def repeat_seconds(self) -> float:
        """How often a still-firing alert is notified again, in seconds."""
        return self._repeat_s

    @property
    def low_utilization(self) -> bool:
        """Whether the policy alerts on too little activity (inhibited by hardware faults)."""
        return self._low_util

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a scope with ``labels`` falls under this policy's matchers (shell patterns)."""
        return all(fnmatch.fnmatchcase(labels.get(k) or "", v) for k, v in self.match.items())

    def document(self) -> dict[str, Any]:
        """The policy as the YAML file and the API write it (``for``, not ``for_``)."""
        doc = self.model_dump(by_alias=True, mode="json")
        if doc["ladder"] is None:
            del doc["ladder"]  # most policies have none; their documents stay as they were
        return doc


def condition_words(policy: PolicySpec) -> str:
    """The policy's condition as a ladder's timeline names it: ``idle-held``, ``idle-empty``
    (a cause), or ``sm_active < 0.3``."""
    cause = cause_of_metric(policy.metric)
    if cause is not None:
        return cause.label.replace("_", "-")
    return f"{policy.metric} {policy.op} {policy.threshold:g}"


# The address a policy's ``channels`` writes for "the job's owner" (a job policy's only): the
# owner's directory addresses on the e-mail and Slack DM channels (service.thresholds.owners).
OWNER_CHANNEL = "owner"
SLACK_API_URL = "https://slack.com/api/chat.postMessage"
ChannelType = Literal["slack", "webhook", "alertmanager", "email", "slack_dm"]


class ChannelSpec(BaseModel):
    """A notification channel: Slack incoming webhook, signed generic webhook, Alertmanager,
    e-mail (through the SMTP server of the settings) or Slack direct messages (a bot token).

    ``to`` holds the fixed recipients of an e-mail or Slack DM channel (addresses, Slack user
    or channel ids) for the alerts a policy sends it; owner notices bring their own.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN)
    type: ChannelType
    url: str = ""  # email: none; slack_dm: Slack's chat.postMessage unless set
    secret: str | None = None
    rate_limit_per_second: float | None = Field(None, gt=0, allow_inf_nan=False)
    to: list[str] = Field(default_factory=list, max_length=50)

    @field_validator("name")
    @classmethod
    def _not_owner(cls, value: str) -> str:
        if value == OWNER_CHANNEL:
            raise ValueError(f"{OWNER_CHANNEL!r} is the job's owner's address; pick another name")
        return value

    @model_validator(mode="after")
    def _url(self) -> ChannelSpec:
        if self.type == "slack_dm" and not self.url:
            self.url = SLACK_API_URL
        if self.type == "email":
            if self.url:
                raise ValueError("url: an e-mail channel has none (SMTP is in the settings)")
        elif not self.url.startswith(("http://", "https://")):
            raise ValueError("url: must be an http:// or https:// URL")
        if self.to and self.type not in ("email", "slack_dm"):
            raise ValueError("to: only email and slack_dm channels have fixed recipients")
        return self

    @property
    def is_http(self) -> bool:
        """Whether the channel posts to its URL (every type but e-mail)."""
        return self.type != "email"

    @field_validator("secret")
    @classmethod
    def _secret(cls, value: str | None) -> str | None:
        problem = None if value is None else webhook_key_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @property
    def messages_per_second(self) -> float:
        """The channel's send rate limit; Slack allows about one message a second."""
        if self.rate_limit_per_second is not None:
            return self.rate_limit_per_second
        return 1.0 if self.type in ("slack", "slack_dm") else 20.0


def first_error(exc: ValidationError, prefix: str = "") -> ValidationFailed:
    """The first pydantic error as ValidationFailed naming the field (``policies.0.threshold``)."""
    err = exc.errors()[0]
    loc = ["for" if p == "for_" else str(p) for p in err["loc"]]
    msg = err["msg"].removeprefix("Value error, ")
    field, sep, rest = msg.partition(": ")
    # A check across fields names its own field, relative to where it sits (``steps.2.after``).
    parts = field.split(".")
    if sep and (not loc or len(parts) > 1) and all(p.isidentifier() or p.isdigit() for p in parts):
        loc, msg = [*loc, *parts], rest
    return ValidationFailed(".".join([p for p in (prefix,) if p] + loc), msg)


def parse_policy(doc: Any, *, prefix: str = "") -> PolicySpec:
    """Validate one policy document; ValidationFailed names the field on error."""
    try:
        return PolicySpec.model_validate(doc)
    except ValidationError as exc:
        raise first_error(exc, prefix) from None


def parse_channel(doc: Any, *, prefix: str = "") -> ChannelSpec:
    """Validate one channel document; ValidationFailed names the field on error."""
    try:
        channel = ChannelSpec.model_validate(doc)
    except ValidationError as exc:
        raise first_error(exc, prefix) from None
    # A recipient goes into a mail's To header: CR or LF there would end it. Checked here, where
    # a channel comes in, not in ChannelSpec, which also reads stored channels back: one stored
    # before this check must not stop the outbox (its deliveries fail with the reason instead).
    for i, address in enumerate(channel.to):
        problem = control_problem(address)
        if problem is not None:
            raise ValidationFailed(".".join(p for p in (prefix, f"to.{i}") if p), problem)
    return channel


def parse_config(
    config: dict[str, Any], *, known_channels: set[str] | None = None
) -> tuple[list[PolicySpec], list[ChannelSpec]]:
    """Policies and channels of a config file; each policy's channels must exist in it or before."""
    raw_channels = config.get("channels") or []
    raw_policies = config.get("policies") or []
    for key, raw in (("channels", raw_channels), ("policies", raw_policies)):
        if not isinstance(raw, list):
            raise ValidationFailed(key, "must be a list")
    channel_specs = [parse_channel(c, prefix=f"channels.{i}") for i, c in enumerate(raw_channels)]
    policy_specs = [parse_policy(p, prefix=f"policies.{i}") for i, p in enumerate(raw_policies)]
    for kind, names_in_order in (
        ("channels", [c.name for c in channel_specs]),
        ("policies", [p.name for p in policy_specs]),
    ):
        seen: set[str] = set()
        for i, name in enumerate(names_in_order):
            if name in seen:
                raise ValidationFailed(f"{kind}.{i}.name", f"{name!r} is defined twice")
            seen.add(name)
    names = {c.name for c in channel_specs} | (known_channels or set())
    for i, p in enumerate(policy_specs):
        check_policy_channels(p, names, prefix=f"policies.{i}")
    return policy_specs, channel_specs


def check_policy_channels(policy: PolicySpec, channel_names: set[str], *, prefix: str = "") -> None:
    """Raise ValidationFailed naming ``channels.N`` if the policy names an unknown channel
    (``owner``, the job's owner, is known to every job policy and every ladder)."""
    for j, name in enumerate(policy.channels):
        field = ".".join(p for p in (prefix, f"channels.{j}") if p)
        if name == OWNER_CHANNEL:
            # A GPU policy's ladder acts on the job holding the GPU, so it has an owner too.
            if policy.scope != "job" and not (policy.scope == "gpu" and policy.ladder):
                raise ValidationFailed(
                    field, "only a job has an owner: write scope: job (or a ladder on scope: gpu)"
                )
            continue
        if name not in channel_names:
            raise ValidationFailed(field, f"no channel named {name!r}")
