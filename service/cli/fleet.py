"""``gpuwarden gpus`` (the fleet on one screen) and ``gpuwarden job ID`` (one job's report)."""

from __future__ import annotations

import argparse
from datetime import datetime
from time import sleep
from typing import Any

from service.cli.http import ApiError, api_get
from service.cli.report import gpu_hours, money, terminal_console
from service.cli.tables import Column, fit_table
from service.clientsettings import ClientSettings
from service.clock import utc_now
from service.core.diagnosis import (
    CAUSE_BY_NAME,
    CAUSE_FIX,
    CAUSE_MEANING,
    CAUSE_NAMES,
    STATE_MEANING,
    STATE_NAMES,
    GpuState,
    causes_of_state,
)
from service.costs.money import SORT_BYS, SORT_FIELDS
from service.local.run import resolve_service
from service.vocabulary import JOB_SOURCE_TEXT, job_path

GIB = 1024**3


def _service_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", dest="central_url", help="central service URL (GPUWARDEN_CENTRAL_URL)")
    p.add_argument("--token", dest="api_token", help="reader token (GPUWARDEN_API_TOKEN)")


def states_help() -> str:
    """The states, what each means and the causes in each, one a line (for --help)."""
    lines = ["states (from the cause of each GPU's latest sample):"]
    for state in GpuState:
        causes = ", ".join(c.label for c in causes_of_state(state))
        also = f" ({causes})" if causes else ""
        lines.append(f"  {state.value:<13} {STATE_MEANING[state]}{also}")
    return "\n".join(lines)


def add_fleet_parsers(sub: Any) -> None:
    """Add ``gpus`` and ``job`` to the ``gpuwarden`` sub-commands."""
    p = sub.add_parser(
        "gpus",
        help="every GPU on one screen, worst first: state, activity, memory, job, $ cost and "
        "waste today",
        epilog=states_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Next to a running `gpuwarden up` or `demo` the service and token are found "
        "by themselves; else give --url and --token.",
    )
    _service_flags(p)
    p.add_argument("--node", help="only this node")
    p.add_argument("--team", help="only GPUs this team's jobs held today or hold now")
    p.add_argument("--state", choices=STATE_NAMES, help="only GPUs in this state")
    p.add_argument(
        "--cause", choices=CAUSE_NAMES, help="only GPUs whose latest sample has this cause"
    )
    p.add_argument(
        "--sort", default="waste", choices=SORT_BYS, help="largest first by these dollars today"
    )
    p.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=5.0,
        metavar="SECONDS",
        help="refresh in place every SECONDS (5) until Ctrl-C",
    )
    p.set_defaults(handler=cmd_gpus)

    p = sub.add_parser(
        "job",
        help="one job in plain text: GPUs, time and dollars by cause, efficiency, advice",
    )
    _service_flags(p)
    p.add_argument("job_id", metavar="ID", help="the job id, e.g. slurm:4242")
    p.set_defaults(handler=cmd_job)


# --- gpus ------------------------------------------------------------------------------


def _memory(gpu: dict[str, Any]) -> str:
    used = gpu.get("latest", {}).get("fb_used_bytes")
    total = gpu.get("fb_total_bytes") or gpu.get("latest", {}).get("fb_total_bytes")
    if used is None:
        # Said, not left blank: the GPU's idle-held or idle was told without its memory.
        return "not reported" if gpu.get("memory_unknown") else ""
    return f"{used / GIB:.0f}/{total / GIB:.0f} GiB" if total else f"{used / GIB:.0f} GiB"


def _activity(gpu: dict[str, Any]) -> str:
    value = gpu.get("activity")
    state = gpu.get("state")
    if value is None or state in (GpuState.LOST, GpuState.NO_DATA):
        return ""
    cause = gpu.get("cause") or ""
    # The idle states say their cause themselves; the others name it.
    why = "" if state in (GpuState.IDLE, GpuState.IDLE_HELD) else f" {cause.replace('_', '-')}"
    return f"{value:.0%}{why}"


def fleet_rows(gpus: list[dict[str, Any]], sort_by: str = "waste") -> list[list[str]]:
    """One row per GPU (as ``GET /fleet`` has them), worst first: most ``sort_by`` dollars
    today (waste by default), then by state (lost, idle-held, idle, underused, ..., working)."""
    rank = {name: i for i, name in enumerate(STATE_NAMES)}
    field = SORT_FIELDS[sort_by]
    keyed = sorted(
        gpus,
        key=lambda g: (
            -(g.get(field) or 0.0),
            rank.get(g["state"], len(rank)),
            g["node"],
            g["index"],
        ),
    )
    return [
        [
            g["node"],
            str(g["index"]),
            g["model"].removeprefix("NVIDIA "),
            g["state"],
            _activity(g),
            _memory(g),
            g.get("job") or "",
            g.get("user") or "",
            money(g.get("cost_usd")),
            money(g.get("waste_usd")),
        ]
        for g in keyed
    ]


FLEET_COLUMNS = [
    Column("node", whole=True),
    Column("gpu", "right", whole=True),
    Column("model", drop=2),
    Column("state", whole=True),
    Column("activity", "right", drop=4),
    Column("memory", "right", drop=3),
    Column("job", whole=True, fold_last=True),
    Column("user", drop=1),
    Column("$ cost today", "right", drop=5),
    Column("$ waste today", "right", whole=True),
]


def fleet_title(fleet: dict[str, Any], args: argparse.Namespace) -> str:
    """The table's headline: the GPUs shown, their cost and waste today and the filters."""
    now = datetime.fromisoformat(str(fleet["now"]).replace("Z", "+00:00"))
    filters = [
        f"{name} {value}"
        for name in ("node", "team", "state", "cause")
        if (value := getattr(args, name, None))
    ]
    return (
        f"{len(fleet['gpus'])} GPU{'' if len(fleet['gpus']) == 1 else 's'}"
        + (f" ({', '.join(filters)})" if filters else "")
        + f" at {now:%Y-%m-%d %H:%M:%S}Z; since {str(fleet['start'])[:10]} 00:00Z: cost "
        f"{money(fleet['cost_usd'])}, waste {money(fleet['waste_usd'])} = idle "
        f"{money(fleet['idle_usd'])} + fixable {money(fleet['fixable_usd'])} (estimated)"
        + (f", lost {money(fleet['lost_usd'])}" if fleet.get("lost_usd") else "")
        + (
            f"; {fleet['held_gpu_hours']:,.2f} GPU-h held, {fleet['waste_gpu_hours']:,.2f} wasted"
            if "waste_gpu_hours" in fleet
            else ""
        )
    )


def _fleet_table(args: argparse.Namespace, settings: ClientSettings, width: int) -> Any:
    # One read: the service filters, so the headline's dollars are those of the GPUs shown
    # and an unknown node or team is refused with the nearest known name.
    params = {k: v for k in ("node", "team", "state", "cause") if (v := getattr(args, k))}
    sort_by = getattr(args, "sort", "waste")
    fleet: dict[str, Any] = api_get(settings, "/fleet", {**params, "sort": sort_by}).json()
    rows = fleet_rows(fleet["gpus"], sort_by)
    table, dropped = fit_table(FLEET_COLUMNS, rows, width=width, title=fleet_title(fleet, args))
    if dropped:
        table.caption = f"left out to fit {width} columns: {', '.join(dropped)}"
    return table


def cmd_gpus(args: argparse.Namespace, settings: ClientSettings) -> int:
    """Print the fleet, one line per GPU, worst first; with --watch, refresh in place."""
    settings = resolve_service(settings)
    console = terminal_console()
    if args.watch is None:
        console.print(_fleet_table(args, settings, console.width))
        return 0
    from rich.live import Live

    with Live(_fleet_table(args, settings, console.width), console=console) as live:
        while True:
            sleep(max(args.watch, 0.5))
            live.update(_fleet_table(args, settings, console.width))


# --- job -------------------------------------------------------------------------------


def _when(text: str | None) -> str:
    if not text:
        return "-"
    return datetime.fromisoformat(text.replace("Z", "+00:00")).strftime("%Y-%m-%d %H:%M:%SZ")


def _span(seconds: float) -> str:
    minutes = int(seconds // 60)
    return f"{minutes // 60}h {minutes % 60:02d}m" if minutes >= 60 else f"{seconds / 60:.0f}m"


def fault_text(f: dict[str, Any]) -> str:
    """One hardware fault of a job's GPU in words: node, GPU index, XID code or lost, times."""
    where = f"{f['node']} GPU {f['gpu_index']}"
    if f["kind"] == "xid":
        return f"{where}: hardware XID {f['xid']} at {_when(f['at'])}"
    lost = money(f.get("lost_usd")) if f.get("lost_seconds") is not None else "n/a"
    return (
        f"{where}: fell off the bus (last sample {_when(f['at'])}, reported lost "
        f"{_when(f.get('lost_at'))}); held lost {gpu_hours(f.get('lost_seconds') or 0.0)} "
        f"GPU-h, {lost}"
    )


def fault_lines(faults: list[dict[str, Any]]) -> list[str]:
    """The report's lines on hardware faults (none when there were none)."""
    if not faults:
        return []
    return ["", "HARDWARE FAULT:"] + [f"  {fault_text(f)}" for f in faults]


def _job_head(job: dict[str, Any], *, now: datetime) -> list[str]:
    """The report's first lines: the job, who ran it, for how long and on which GPUs."""
    started = datetime.fromisoformat(job["started_at"].replace("Z", "+00:00"))
    ended = job.get("ended_at")
    stop = datetime.fromisoformat(ended.replace("Z", "+00:00")) if ended else now
    who = ", ".join(
        f"{k} {job[k]}" for k in ("user", "team", "project") if job.get(k)
    )  # fmt: skip
    lines = [
        f"Job {job['id']}"
        + (f" ({who})" if who else "")
        + f", {JOB_SOURCE_TEXT.get(job['source'], job['source'])}",
        f"  {'ran' if ended else 'running'} {_when(job['started_at'])} to "
        f"{_when(ended) if ended else 'now'}: {_span((stop - started).total_seconds())}",
    ]
    return lines + _gpu_lines(job.get("gpus") or [])


def _gpu_lines(gpus: list[dict[str, Any]]) -> list[str]:
    """How many GPUs the job held, then each holding: GPU, node, from and until when."""
    lines = [f"  GPUs: {len({g['gpu_uuid'] for g in gpus})}"]
    for g in gpus:
        until = _when(g["ended_at"]) if g.get("ended_at") else "now"
        lines.append(f"    {g['gpu_uuid']} on {g['node']}, {_when(g['started_at'])} to {until}")
    return lines


def _money_lines(s: dict[str, Any]) -> list[str]:
    """The job's GPU-hours, cost, waste and efficiency, from its summary ``s``."""
    eff = s.get("efficiency")
    return [
        "",
        f"GPU time: {gpu_hours(s['held_seconds'])} GPU-h held, "
        f"{gpu_hours(s['allocated_seconds'])} with data",
        f"Cost: {money(s['cost_usd'])}"
        + (f" (no data {money(s['nodata_usd'])})" if s.get("nodata_seconds") else "")
        + (
            f" (lost, GPU fell off the bus: {money(s['lost_usd'])})"
            if s.get("lost_seconds")
            else ""
        ),
        f"Waste: {money(s['waste_usd'])} = idle {money(s['idle_usd'])} + fixable "
        f"{money(s['fixable_usd'])} (estimated)",
        f"Waste in GPU-hours: {gpu_hours(s.get('waste_gpu_hours', 0.0) * 3600)} = idle "
        f"{gpu_hours(s.get('idle_gpu_hours', 0.0) * 3600)} + fixable "
        f"{gpu_hours(s.get('fixable_gpu_hours', 0.0) * 3600)}",
        f"Efficiency (time-weighted activity): {'n/a' if eff is None else f'{eff:.0%}'}",
    ]


def _cause_lines(causes: dict[str, dict[str, Any]]) -> list[str]:
    """GPU-hours, cost, waste and share of time of each cause that had time, most first."""
    if not causes:
        return []
    covered = sum(c["seconds"] for c in causes.values()) or 1.0
    lines = ["", "Time and dollars by cause (cost, waste):"]
    for name, c in sorted(causes.items(), key=lambda kv: -kv[1]["seconds"]):
        if c["seconds"] <= 0:
            continue
        lines.append(
            f"  {name:<18} {gpu_hours(c['seconds']):>7} GPU-h {money(c.get('usd')):>10}"
            f" {money(c.get('waste_usd')):>10} {c['seconds'] / covered:>5.0%}"
        )
    return lines


def _per_gpu_lines(per_gpu: list[dict[str, Any]]) -> list[str]:
    """Each GPU's GPU-hours, cost, waste and efficiency, for a job of more than one GPU."""
    if len(per_gpu) <= 1:
        return []
    lines = ["", "Per GPU:"]
    for g in per_gpu:
        e = g.get("efficiency")
        lines.append(
            f"  {g['gpu_uuid']}  {gpu_hours(g['allocated_seconds'])} GPU-h  "
            f"cost {money(g['cost_usd'])}  waste {money(g['waste_usd'])}  "
            f"efficiency {'n/a' if e is None else f'{e:.0%}'}"
        )
    return lines


def _advice_lines(job: dict[str, Any]) -> list[str]:
    """The priced fixes and their dollar saving, else the top cause's meaning and fix."""
    fixes = job.get("recommendations")
    if fixes:
        saved = job.get("savings_usd")
        lines = ["", f"Recommendations (together they save {money(saved)}):"]
        for f in fixes:
            what = f["cause"] if f["kind"] == "cause" else f["kind"].replace("_", " ")
            base = f.get("base") or f"{gpu_hours(f['seconds'])} GPU-h"
            lines.append(f"  - {money(f['saving_usd'])} {what}: {f['action']}")
            lines.append(f"      {f['saving_fraction']:.0%} of {base}, assuming {f['assumption']}")
        return lines
    top = CAUSE_BY_NAME.get(job["summary"].get("top_cause") or "")
    if top not in CAUSE_FIX:  # no fix to name either
        return []
    saving = job.get("savings") or {}
    if saving.get("fix_applied") and saving.get("fix_cause") == top.label:
        # A fixed run is never told the fix it applies (docs/savings.md).
        return ["", "Recommendations:", f"  - {top.label}: {CAUSE_MEANING[top]}",
                "      its fix is already applied by this run"]  # fmt: skip
    return [
        "",
        "Recommendations:",
        f"  - {top.label}: {CAUSE_MEANING[top]}",
        f"      fix: {CAUSE_FIX[top]}",
    ]


def _energy_lines(energy: dict[str, Any] | None) -> list[str]:
    """The job's energy in kWh and dollars, and the part drawn while nothing ran."""
    if not energy:
        return []
    return [
        f"Energy: {energy['kwh']:.3f} kWh, {money(energy['usd'])} at "
        f"${energy['usd_per_kwh']:g}/kWh ({energy['source'].replace('_', ' ')}); "
        f"{energy['idle_kwh']:.3f} kWh ({money(energy['idle_usd'])}) while nothing ran"
    ]


def _work_lines(job: dict[str, Any]) -> list[str]:
    """The job's reported progress and its GPU-seconds per unit of it (or the whole run)."""
    text = job.get("unit_of_work_text")
    if not text:
        return []
    p = job.get("progress")
    if not p:
        return [f"Unit of work: {text}"]
    rate = p.get("rate_per_second")
    last = p.get("last_advanced_at")
    return [
        f"Progress: {p['last_value']:,.0f} {p['unit']} (from {p['first_value']:,.0f}: "
        f"{p['units_advanced']:,.0f} advanced"
        + ("" if rate is None else f", {rate:,.3g}/s")
        + f"); last advanced {_when(last) if last else 'never'}",
        f"Unit of work: {text}",
    ]


def _savings_lines(saving: dict[str, Any] | None) -> list[str]:
    """What the run saved against the earlier run of its work that was told a fix: promised
    beside realised, or why the two were not compared."""
    if not saving:
        return []
    head = f"Proven saving (against {saving['compared_with']}, per "
    head += "unit of progress):" if saving["unit"] == "progress" else "whole run, no progress):"
    cause = saving.get("fix_cause")
    fix = (
        f"  fix applied: {cause} {saving['fix_share_before']:.0%} -> "
        f"{saving['fix_share_after']:.0%} of the run"
        if cause
        else "  no fix told was applied (no advised cause's share fell by half)"
    )
    lines = ["", head, fix]
    if saving["verdict"] == "not_compared":
        return [*lines, f"  not compared: {saving['reason']}"]
    promised = saving.get("promised_fraction")
    lines.append(
        f"  realised {saving['realised_fraction']:.1%} ({money(saving['realised_usd'])})"
        + (
            ""
            if promised is None
            else f", promised {promised:.1%} ({money(saving['promised_usd'])})"
        )
        + f"; noise ±{saving['noise_fraction']:.1%}: {saving['verdict'].replace('_', ' ')}"
    )
    if saving.get("reason"):
        lines.append(f"  {saving['reason']}")
    return lines


def job_report(job: dict[str, Any], *, now: datetime) -> str:
    """A jobstats-style plain-text report of ``GET /jobs/{id}``'s answer."""
    s = job["summary"]
    lines = _job_head(job, now=now)
    lines += fault_lines(job.get("faults") or [])
    lines += _money_lines(s)
    lines += _work_lines(job)
    lines += _cause_lines(s.get("causes") or {})
    lines += _per_gpu_lines(job.get("per_gpu") or [])
    lines += _advice_lines(job)
    lines += _savings_lines(job.get("savings"))
    lines += _energy_lines(job.get("energy"))
    lines += [f"warning: {w}" for w in job.get("warnings") or []]
    return "\n".join(lines)


def cmd_job(args: argparse.Namespace, settings: ClientSettings) -> int:
    """Print one job's report (GET /api/v1/jobs/{id}) as plain text."""
    settings = resolve_service(settings)
    try:
        job = api_get(settings, job_path(args.job_id)).json()
    except ApiError as exc:
        meant = _job_meant(settings, args.job_id) if exc.status == 404 else None
        if meant is None:
            raise
        raise ApiError(
            f"no job {args.job_id!r}; did you mean {meant}? (gpuwarden job {meant})"
        ) from None
    print(job_report(job, now=utc_now()))
    return 0


# Schedulers whose job ids people write bare (``5681`` for ``slurm:5681``).
BARE_ID_PREFIXES = ("slurm",)


def _job_meant(settings: ClientSettings, job_id: str) -> str | None:
    """The scheduler-prefixed id of a bare ``job_id`` that exists, if one does."""
    if ":" in job_id:
        return None
    for prefix in BARE_ID_PREFIXES:
        candidate = f"{prefix}:{job_id}"
        try:
            api_get(settings, job_path(candidate))
        except ApiError:
            continue
        return candidate
    return None
