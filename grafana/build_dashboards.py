# ruff: noqa: E501  (PromQL reads better on one line)
"""Writes the GPU Warden Grafana dashboards (grafana/dashboards/*.json) from one description.

Run `python grafana/build_dashboards.py` after editing; a test fails when the JSON files and
this script disagree, and another checks that every metric a panel queries is one /metrics exports.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "dashboards"
DS = {"type": "prometheus", "uid": "${datasource}"}
GPU = 'node=~"$node", gpu_uuid=~"$gpu_uuid"'
JOB = 'job_id=~"$job_id", user=~"$user", team=~"$team"'


def with_job(expr: str, sel: str = "") -> str:
    """``expr`` (per-GPU series) with the labels of the job holding each GPU, from
    gpuwarden_gpu_job_info (selected by ``sel``): the per-GPU families carry no job labels."""
    return (
        f"{expr} * on (instance, gpu_uuid) group_left (job_id, user, team, project) "
        f"gpuwarden_gpu_job_info{{{sel}}}"
    )


UNALLOCATED_WASTE = with_job("gpuwarden_gpu_waste_usd_per_hour", 'job_id=""')

Panel = dict[str, Any]


def target(expr: str, legend: str = "", *, instant: bool = False, ref: str = "A") -> dict[str, Any]:
    """One Prometheus query of a panel."""
    t: dict[str, Any] = {"datasource": DS, "expr": expr, "refId": ref, "legendFormat": legend}
    if instant:
        t |= {"instant": True, "range": False, "format": "table"}
    return t


def _targets(queries: list[tuple[str, str]], instant: bool = False) -> list[dict[str, Any]]:
    return [
        target(expr, legend, instant=instant, ref=chr(ord("A") + i))
        for i, (expr, legend) in enumerate(queries)
    ]


def timeseries(
    title: str, queries: list[tuple[str, str]], unit: str, *, w: int = 12, h: int = 8, **opts: Any
) -> Panel:
    """A time-series panel."""
    defaults: dict[str, Any] = {"unit": unit, "custom": {"fillOpacity": 10, "showPoints": "never"}}
    if unit == "percentunit":
        defaults |= {"min": 0, "max": 1}
    return {
        "type": "timeseries",
        "title": title,
        "datasource": DS,
        "targets": _targets(queries),
        "fieldConfig": {"defaults": defaults | opts, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "_size": (w, h),
    }


def stat(
    title: str, expr: str, unit: str, *, w: int = 4, h: int = 4, red_above: float | None = None
) -> Panel:
    """A single-number panel; turns red above ``red_above`` when given."""
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    if red_above is not None:
        steps.append({"color": "red", "value": red_above})
    return {
        "type": "stat",
        "title": title,
        "datasource": DS,
        "targets": [target(expr)],
        "fieldConfig": {
            "defaults": {"unit": unit, "thresholds": {"mode": "absolute", "steps": steps}},
            "overrides": [],
        },
        "options": {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "background"},
        "_size": (w, h),
    }


def table(title: str, queries: list[tuple[str, str]], *, w: int = 24, h: int = 9) -> Panel:
    """A table of instant queries merged on their labels."""
    return {
        "type": "table",
        "title": title,
        "datasource": DS,
        "targets": _targets(queries, instant=True),
        "transformations": [
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {"excludeByName": {"Time": True}}},
        ],
        "fieldConfig": {"defaults": {}, "overrides": []},
        "_size": (w, h),
    }


def row(title: str) -> Panel:
    """A collapsible row header."""
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "_size": (24, 1)}


def variable(name: str, query: str, *, label: str, multi: bool = True) -> dict[str, Any]:
    """A query template variable with an All option."""
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "query": {"query": query, "refId": f"{name}-var"},
        "definition": query,
        "refresh": 2,
        "multi": multi,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


DATASOURCE_VAR = {
    "name": "datasource",
    "label": "Prometheus",
    "type": "datasource",
    "query": "prometheus",
    "current": {},
    "hide": 0,
}


def layout(panels: list[Panel]) -> list[Panel]:
    """Place panels left to right, top to bottom, on Grafana's 24-column grid; number them."""
    x = y = row_h = 0
    out = []
    for i, p in enumerate(panels, start=1):
        w, h = p.pop("_size")
        if x + w > 24:
            x, y, row_h = 0, y + row_h, 0
        p["gridPos"] = {"x": x, "y": y, "w": w, "h": h}
        p["id"] = i
        x += w
        row_h = max(row_h, h)
        out.append(p)
    return out


def dashboard(
    uid: str, title: str, panels: list[Panel], variables: list[dict[str, Any]]
) -> dict[str, Any]:
    """A whole dashboard in Grafana's JSON model."""
    return {
        "uid": uid,
        "title": title,
        "tags": ["gpuwarden", "gpu"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": [DATASOURCE_VAR, *variables]},
        "links": [
            {"type": "dashboards", "tags": ["gpuwarden"], "asDropdown": True, "title": "GPU Warden"}
        ],
        "panels": layout(panels),
    }


def fleet() -> dict[str, Any]:
    """Fleet overview: how many GPUs idle now, what it costs, and the service's own health."""
    panels = [
        stat("GPUs reporting", "gpuwarden_fleet_gpus", "none"),
        stat("Idle now", "gpuwarden_fleet_gpus_idle", "none"),
        stat("Idle but holding memory", "gpuwarden_fleet_gpus_idle_held", "none", red_above=1),
        stat("Lost GPUs", "gpuwarden_fleet_gpus_lost", "none", red_above=1),
        stat("Waste now", "gpuwarden_fleet_waste_usd_per_hour", "currencyUSD"),
        stat("Spend now", "gpuwarden_fleet_cost_usd_per_hour", "currencyUSD"),
        timeseries(
            "Mean activity by model (sm_active, else gr_engine_active, else gpu_util)",
            [("avg by (model) (gpuwarden_gpu_activity_ratio)", "{{model}}")],
            "percentunit",
        ),
        timeseries(
            "GPUs by cause (why their time goes where it goes)",
            [("gpuwarden_fleet_gpus_by_cause", "{{cause}}")],
            "none",
        ),
        timeseries(
            "Sham and hung GPUs (busy, but no useful work: keep-alive loops, hung jobs)",
            [('sum by (state) (gpuwarden_fleet_gpus_by_state{state=~"sham|hung"})', "{{state}}")],
            "none",
        ),
        timeseries(
            "Idle and idle-held GPUs",
            [
                ("gpuwarden_fleet_gpus_idle", "idle"),
                ("gpuwarden_fleet_gpus_idle_held", "idle, memory held"),
                ("gpuwarden_fleet_gpus", "reporting"),
            ],
            "none",
        ),
        timeseries(
            "Waste per hour, by team",
            [(f"sum by (team) ({with_job('gpuwarden_gpu_waste_usd_per_hour')})", "{{team}}")],
            "currencyUSD",
        ),
        timeseries(
            "Mean activity by node",
            [("avg by (node) (gpuwarden_gpu_activity_ratio)", "{{node}}")],
            "percentunit",
        ),
        table(
            "Nodes now",
            [
                ("count by (node) (gpuwarden_gpu_info)", "GPUs"),
                ("avg by (node) (gpuwarden_gpu_activity_ratio)", "mean activity"),
                ("sum by (node) (gpuwarden_gpu_idle)", "idle GPUs"),
                ("sum by (node) (gpuwarden_gpu_waste_usd_per_hour)", "waste USD/h"),
                ("sum by (node) (gpuwarden_gpu_power_watts)", "power W"),
            ],
        ),
        stat("Unpriced GPUs", "gpuwarden_fleet_gpus_unpriced", "none", red_above=1),
        stat(
            "Unallocated waste",
            f"sum({UNALLOCATED_WASTE})",
            "currencyUSD",
        ),
        stat("Fleet power", "sum(gpuwarden_gpu_power_watts)", "watt"),
        stat("Fleet memory in use", "sum(gpuwarden_gpu_fb_used_bytes)", "bytes"),
        stat(
            "Waste in range",
            "sum(sum_over_time(gpuwarden_fleet_waste_usd_per_hour[$__range:1m])) / 60",
            "currencyUSD",
        ),
        stat("Scrape reads DB", "min(gpuwarden_fleet_metrics_up)", "bool"),
        row("GPU Warden service"),
        timeseries(
            "Ingest rate",
            [
                ("sum(rate(gpuwarden_ingest_samples_total[5m]))", "samples/s"),
                (
                    "sum by (outcome) (rate(gpuwarden_ingest_batches_total[5m]))",
                    "batches/s {{outcome}}",
                ),
            ],
            "ops",
            w=8,
        ),
        timeseries(
            "Ingest batch latency",
            [
                (
                    "histogram_quantile(0.5, sum by (le) (rate(gpuwarden_ingest_batch_duration_seconds_bucket[5m])))",
                    "p50",
                ),
                (
                    "histogram_quantile(0.99, sum by (le) (rate(gpuwarden_ingest_batch_duration_seconds_bucket[5m])))",
                    "p99",
                ),
            ],
            "s",
            w=8,
        ),
        timeseries(
            "Database errors",
            [("sum by (operation) (rate(gpuwarden_database_errors_total[5m]))", "{{operation}}")],
            "ops",
            w=8,
        ),
        timeseries(
            "Background jobs",
            [
                (
                    "sum by (task, outcome) (increase(gpuwarden_background_job_runs_total[15m]))",
                    "{{task}} {{outcome}}",
                ),
            ],
            "none",
            w=8,
        ),
        timeseries(
            "Policy evaluation duration",
            [
                (
                    "histogram_quantile(0.9, sum by (le) (rate(gpuwarden_evaluation_duration_seconds_bucket[5m])))",
                    "p90",
                )
            ],
            "s",
            w=8,
        ),
        timeseries(
            "Notifications",
            [
                ("gpuwarden_outbox_depth", "outbox depth"),
                (
                    "sum by (channel, outcome) (increase(gpuwarden_notifications_total[15m]))",
                    "{{channel}} {{outcome}}",
                ),
            ],
            "none",
            w=8,
        ),
        timeseries(
            "/metrics fleet read time",
            [("max(gpuwarden_fleet_metrics_duration_seconds)", "read + build")],
            "s",
            w=24,
            h=6,
        ),
        # The agents' own /metrics (scrape job gpuwarden-agent): what never reaches the central.
        row("GPU Warden agents"),
        timeseries(
            "Since central last accepted a batch, by node",
            # 0: none accepted since the agent started.
            [("time() - (max by (node) (gpuwarden_agent_last_successful_push_timestamp_seconds) > 0)", "{{node}}")],
            "s",
            w=8,
        ),
        timeseries(
            "Polls waiting in the spool, by node",
            [("max by (node) (gpuwarden_agent_spool_batches)", "{{node}}")],
            "none",
            w=8,
        ),
        timeseries(
            "Polls lost or refused, by node",
            [
                ("sum by (node) (increase(gpuwarden_agent_dropped_batches_total[15m]))", "{{node}} dropped (spool full)"),
                ("sum by (node) (increase(gpuwarden_agent_dead_letter_batches_total[15m]))", "{{node}} dead-lettered (refused)"),
            ],
            "none",
            w=8,
        ),
        timeseries(
            "Agent errors by kind",
            [("sum by (kind) (increase(gpuwarden_agent_errors_total[15m]))", "{{kind}}")],
            "none",
            w=24,
            h=6,
        ),
    ]
    variables: list[dict[str, Any]] = []
    return dashboard("gpuwarden-fleet", "GPU Warden / Fleet overview", panels, variables)


def node_gpu() -> dict[str, Any]:
    """Node and GPU detail: every activity figure, memory, power, PCIe and NVLink per GPU."""

    def per_gpu(metric: str) -> list[tuple[str, str]]:
        return [(f"{metric}{{{GPU}}}", "{{node}} GPU {{gpu_index}}")]

    panels = [
        table(
            "GPUs",
            [
                (f"gpuwarden_gpu_sm_active_ratio{{{GPU}}}", "SM active"),
                (f"gpuwarden_gpu_fb_used_bytes{{{GPU}}}", "memory used"),
                (f"gpuwarden_gpu_power_watts{{{GPU}}}", "power"),
            ],
            h=7,
        ),
        timeseries("SM active", per_gpu("gpuwarden_gpu_sm_active_ratio"), "percentunit"),
        timeseries("SM occupancy", per_gpu("gpuwarden_gpu_sm_occupancy_ratio"), "percentunit"),
        timeseries(
            "Tensor pipe active", per_gpu("gpuwarden_gpu_tensor_active_ratio"), "percentunit"
        ),
        timeseries("DRAM active", per_gpu("gpuwarden_gpu_dram_active_ratio"), "percentunit"),
        timeseries(
            "Graphics engine active", per_gpu("gpuwarden_gpu_gr_engine_active_ratio"), "percentunit"
        ),
        timeseries(
            "NVML utilization (coarse)",
            [
                *per_gpu("gpuwarden_gpu_gpu_util_ratio"),
                (
                    f"gpuwarden_gpu_mem_copy_util_ratio{{{GPU}}}",
                    "{{node}} GPU {{gpu_index}} mem copy",
                ),
            ],
            "percentunit",
        ),
        timeseries(
            "Video encoder and decoder",
            [
                (f"gpuwarden_gpu_enc_util_ratio{{{GPU}}}", "{{node}} GPU {{gpu_index}} encoder"),
                (f"gpuwarden_gpu_dec_util_ratio{{{GPU}}}", "{{node}} GPU {{gpu_index}} decoder"),
            ],
            "percentunit",
        ),
        timeseries(
            "Memory used, free and total",
            [
                *per_gpu("gpuwarden_gpu_fb_used_bytes"),
                (f"gpuwarden_gpu_fb_free_bytes{{{GPU}}}", "{{node}} GPU {{gpu_index}} free"),
                (f"gpuwarden_gpu_fb_total_bytes{{{GPU}}}", "{{node}} GPU {{gpu_index}} total"),
            ],
            "bytes",
        ),
        timeseries("Power", per_gpu("gpuwarden_gpu_power_watts"), "watt"),
        timeseries(
            "Energy used (rate)",
            [
                (
                    f"rate(gpuwarden_gpu_energy_joules_total{{{GPU}}}[5m])",
                    "{{node}} GPU {{gpu_index}}",
                )
            ],
            "watt",
        ),
        timeseries("Temperature", per_gpu("gpuwarden_gpu_temperature_celsius"), "celsius"),
        timeseries("SM clock", per_gpu("gpuwarden_gpu_sm_clock_hertz"), "hertz"),
        timeseries(
            "PCIe throughput",
            [
                (
                    f"gpuwarden_gpu_pcie_tx_bytes_per_second{{{GPU}}}",
                    "{{node}} GPU {{gpu_index}} tx",
                ),
                (
                    f"gpuwarden_gpu_pcie_rx_bytes_per_second{{{GPU}}}",
                    "{{node}} GPU {{gpu_index}} rx",
                ),
            ],
            "Bps",
        ),
        timeseries(
            "NVLink throughput",
            [
                (
                    f"gpuwarden_gpu_nvlink_tx_bytes_per_second{{{GPU}}}",
                    "{{node}} GPU {{gpu_index}} tx",
                ),
                (
                    f"gpuwarden_gpu_nvlink_rx_bytes_per_second{{{GPU}}}",
                    "{{node}} GPU {{gpu_index}} rx",
                ),
            ],
            "Bps",
        ),
        timeseries("Last XID", per_gpu("gpuwarden_gpu_xid_last"), "none"),
        timeseries("Waste", per_gpu("gpuwarden_gpu_waste_usd_per_hour"), "currencyUSD"),
        # Any of these pages as a hardware fault: a failure state, or a counter's rise.
        timeseries(
            "Row remapping and PCIe replays",
            [
                (
                    f"gpuwarden_gpu_row_remap_failure{{{GPU}}}",
                    "{{node}} GPU {{gpu_index}} remap failed",
                ),
                (
                    f"increase(gpuwarden_gpu_remapped_rows_uncorrectable_total{{{GPU}}}[10m])",
                    "{{node}} GPU {{gpu_index}} rows remapped (10m)",
                ),
                (
                    f"increase(gpuwarden_gpu_pcie_replays_total{{{GPU}}}[10m])",
                    "{{node}} GPU {{gpu_index}} PCIe replays (10m)",
                ),
            ],
            "none",
        ),
        # DCGM's memory and NVLink health watches: rises page, NVLink CRC errors do not.
        timeseries(
            "ECC, retired pages and NVLink errors",
            [
                (
                    f"increase(gpuwarden_gpu_ecc_dbe_errors_total{{{GPU}}}[10m])",
                    "{{node}} GPU {{gpu_index}} double-bit ECC (10m)",
                ),
                (
                    f"increase(gpuwarden_gpu_retired_pages_dbe_total{{{GPU}}}[10m])",
                    "{{node}} GPU {{gpu_index}} pages retired (10m)",
                ),
                (
                    f"gpuwarden_gpu_retired_pages_pending{{{GPU}}}",
                    "{{node}} GPU {{gpu_index}} pages pending retirement",
                ),
                (
                    f"increase(gpuwarden_gpu_nvlink_recovery_errors_total{{{GPU}}}[10m])",
                    "{{node}} GPU {{gpu_index}} NVLink recoveries (10m)",
                ),
                (
                    f"increase(gpuwarden_gpu_nvlink_crc_errors_total{{{GPU}}}[10m])",
                    "{{node}} GPU {{gpu_index}} NVLink CRC errors (10m)",
                ),
                (
                    f"increase(gpuwarden_gpu_nvlink_replay_errors_total{{{GPU}}}[10m])",
                    "{{node}} GPU {{gpu_index}} NVLink replays (10m)",
                ),
            ],
            "none",
        ),
        # 1 while a hardware bit (0x8, 0x40, 0x80) of NVML's clocks event reasons is set.
        timeseries(
            "Hardware slowdown",
            [
                (
                    f"clamp_max(floor(gpuwarden_gpu_clocks_event_reasons{{{GPU}}} / 8) % 2"
                    f" + floor(gpuwarden_gpu_clocks_event_reasons{{{GPU}}} / 64) % 2"
                    f" + floor(gpuwarden_gpu_clocks_event_reasons{{{GPU}}} / 128) % 2, 1)",
                    "{{node}} GPU {{gpu_index}}",
                ),
            ],
            "none",
        ),
    ]
    variables = [
        variable("node", "label_values(gpuwarden_gpu_info, node)", label="Node"),
        variable(
            "gpu_uuid", 'label_values(gpuwarden_gpu_info{node=~"$node"}, gpu_uuid)', label="GPU"
        ),
    ]
    return dashboard("gpuwarden-node-gpu", "GPU Warden / Node and GPU detail", panels, variables)


def jobs() -> dict[str, Any]:
    """Job efficiency and waste: which jobs hold GPUs they do not use, and what that costs.

    Efficiency is the activity ladder (sm_active, else gr_engine_active, else gpu_util), as on
    the fleet dashboard: a stock dcgm-exporter never sends SM_ACTIVE. Jobs come from
    gpuwarden_gpu_job_info, joined to the per-GPU series on the GPU.
    """
    sel = f'job_id!="", {JOB}'
    by = "job_id, user, team"

    def joined(metric: str) -> str:
        return with_job(metric, sel)

    activity = joined("gpuwarden_gpu_activity_ratio")
    wasted = joined("gpuwarden_gpu_waste_usd_per_hour")
    panels = [
        stat("Jobs on GPUs", f"count(count by (job_id) (gpuwarden_gpu_job_info{{{sel}}}))", "none"),
        stat("GPUs held by jobs", f"count(gpuwarden_gpu_job_info{{{sel}}})", "none"),
        stat("Mean efficiency", f"avg({activity})", "percentunit"),
        stat("Waste of jobs now", f"sum({wasted})", "currencyUSD"),
        stat("Idle GPUs in jobs", f"sum({joined('gpuwarden_gpu_idle')})", "none", red_above=1),
        stat(
            "Waste of jobs in range",
            f"sum(sum_over_time(({wasted})[$__range:1m])) / 60",
            "currencyUSD",
        ),
        table(
            "Jobs now",
            [
                (f"count by ({by}) (gpuwarden_gpu_job_info{{{sel}}})", "GPUs"),
                (f"avg by ({by}) ({activity})", "efficiency"),
                (f"avg by ({by}) ({joined('gpuwarden_gpu_tensor_active_ratio')})", "tensor active"),
                (f"sum by ({by}) ({joined('gpuwarden_gpu_idle')})", "idle GPUs"),
                (f"sum by ({by}) ({joined('gpuwarden_gpu_price_usd_per_hour')})", "cost USD/h"),
                (f"sum by ({by}) ({wasted})", "waste USD/h"),
            ],
        ),
        timeseries(
            "Efficiency (mean activity) per job",
            [(f"avg by (job_id) ({activity})", "{{job_id}}")],
            "percentunit",
        ),
        timeseries(
            "Waste per job",
            [(f"sum by (job_id) ({wasted})", "{{job_id}}")],
            "currencyUSD",
        ),
        timeseries(
            "Waste per user",
            [(f"sum by (user) ({wasted})", "{{user}}")],
            "currencyUSD",
        ),
        timeseries(
            "Waste per team",
            [(f"sum by (team) ({wasted})", "{{team}}")],
            "currencyUSD",
        ),
        timeseries(
            "Memory held per job",
            [(f"sum by (job_id) ({joined('gpuwarden_gpu_fb_used_bytes')})", "{{job_id}}")],
            "bytes",
        ),
        timeseries(
            "Unallocated GPUs: waste",
            [(f"sum({UNALLOCATED_WASTE})", "unallocated")],
            "currencyUSD",
        ),
    ]
    variables = [
        variable("team", 'label_values(gpuwarden_gpu_job_info{job_id!=""}, team)', label="Team"),
        variable("user", 'label_values(gpuwarden_gpu_job_info{team=~"$team"}, user)', label="User"),
        variable(
            "job_id",
            'label_values(gpuwarden_gpu_job_info{team=~"$team", user=~"$user"}, job_id)',
            label="Job",
        ),
    ]
    return dashboard("gpuwarden-jobs", "GPU Warden / Job efficiency and waste", panels, variables)


def alerts() -> dict[str, Any]:
    """Alerts: what fires in Prometheus and in GPU Warden, and the hardware behind it."""
    panels = [
        stat(
            "Firing (Prometheus rules)",
            'count(ALERTS{alertstate="firing", alertname=~"Gpu.*"}) or vector(0)',
            "none",
            red_above=1,
        ),
        stat(
            "Firing (GPU Warden)", "sum(gpuwarden_alerts_firing) or vector(0)", "none", red_above=1
        ),
        stat(
            "GPUs with an XID",
            "count(gpuwarden_gpu_xid_last > 0) or vector(0)",
            "none",
            red_above=1,
        ),
        stat("GPUs lost", "gpuwarden_fleet_gpus_lost", "none", red_above=1),
        stat(
            "GPUs above 85 C",
            "count(gpuwarden_gpu_temperature_celsius > 85) or vector(0)",
            "none",
            red_above=1,
        ),
        stat("Outbox depth", "sum(gpuwarden_outbox_depth)", "none", red_above=100),
        table(
            "Firing alerts (Prometheus rules)",
            [('ALERTS{alertstate="firing", alertname=~"Gpu.*"}', "")],
        ),
        timeseries(
            "Firing by severity (GPU Warden evaluator)",
            [("sum by (severity) (gpuwarden_alerts_firing)", "{{severity}}")],
            "none",
        ),
        timeseries(
            "Firing by rule (Prometheus)",
            [
                (
                    'count by (alertname) (ALERTS{alertstate="firing", alertname=~"Gpu.*"})',
                    "{{alertname}}",
                )
            ],
            "none",
        ),
        timeseries(
            "Notifications by channel and outcome",
            [
                (
                    "sum by (channel, outcome) (increase(gpuwarden_notifications_total[15m]))",
                    "{{channel}} {{outcome}}",
                )
            ],
            "none",
        ),
        timeseries(
            "Evaluation duration",
            [
                (
                    "histogram_quantile(0.9, sum by (le) (rate(gpuwarden_evaluation_duration_seconds_bucket[5m])))",
                    "p90",
                )
            ],
            "s",
        ),
        table(
            "Hardware: XIDs, lost GPUs",
            [
                ("gpuwarden_gpu_xid_last > 0", "XID"),
                ("gpuwarden_gpu_lost", "lost"),
            ],
        ),
        table(
            # The stored cause, as the fleet and the idle-held-gpu rule read it: memory
            # figures alone miss a process below 1 GiB and read 0 without the FB fields.
            "Idle GPUs holding memory (idle-held)",
            [('gpuwarden_gpu_cause{cause="idle_held"} == 1', "idle-held")],
        ),
    ]
    return dashboard("gpuwarden-alerts", "GPU Warden / Alerts", panels, [])


DASHBOARDS = {
    "fleet-overview.json": fleet,
    "node-gpu-detail.json": node_gpu,
    "job-efficiency.json": jobs,
    "alerts.json": alerts,
}


def render_all() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    return {
        name: json.dumps(build(), indent=2, sort_keys=True) + "\n"
        for name, build in DASHBOARDS.items()
    }


def main() -> None:
    """Write every dashboard's JSON into grafana/dashboards/."""
    OUT.mkdir(exist_ok=True)
    for name, text in render_all().items():
        (OUT / name).write_text(text)
        print(f"wrote {OUT / name}")


if __name__ == "__main__":
    main()
