"""The Grafana dashboard of dtpo's live metrics (``dtpo dashboard --out FILE``; a copy is in ``dashboards/``).

Every panel is one :class:`Panel` of :data:`PANELS`, its PromQL in one place, so tests and the integration
check can list the queries (:func:`dashboard_queries`) and evaluate them (:func:`resolve_query` fills in the
dashboard's variables). Panels outside the GPU row use only ``dtpo_*`` series, which every run exports, a
CPU-only run included (a tuner's own series, :data:`TUNER_SERIES`, only with a fallback on such series); the GPU
row uses dcgm-exporter's ``DCGM_FI_*`` names, which dtpo exports for NVIDIA GPUs (and which dcgm-exporter's own
panels read too).

The datasource is the ``datasource`` variable (any Prometheus), and the ``run_id``, ``Hostname`` and ``rank``
variables (multi-select, "All" by default) filter every panel; the breakdown panel repeats per rank.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

UID = "dtpo-live"
TITLE = "dtpo: distributed training power"
SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

SEL = 'run_id=~"$run_id", Hostname=~"$Hostname"'
"""The selector every panel filters by."""
RANK_SEL = SEL + ', rank=~"$rank"'
POWER = f"sum by (run_id) (dtpo_device_power_watts{{{SEL}}})"
THROUGHPUT = f"sum by (run_id) (dtpo_throughput_samples_per_second{{{SEL}}})"
TUNER_SERIES = frozenset({"dtpo_batch_share"})
"""Series only some runs export (a tuner's); a panel that reads one falls back (PromQL ``or``) on series every run
exports, so it has data in every run."""
BATCH_SHARE = (f"dtpo_batch_share{{{RANK_SEL}}} or on (run_id, Hostname, rank) "
               f"(rate(dtpo_samples_total{{{RANK_SEL}}}[$__rate_interval]) / "
               f"rate(dtpo_steps_total{{{RANK_SEL}}}[$__rate_interval]))")
"""Each rank's samples per step: the rebalancer's share where it runs, else what the counters say (so the panel
has data in every run, as every panel outside the GPU row does)."""

GPU_ROW = "GPU (dcgm-exporter names; NVIDIA GPUs only)"


@dataclass(frozen=True)
class Target:
    """One query of a panel.

    Attributes:
        expr: PromQL.
        legend: Grafana legend format.
        instant: Evaluate at the latest time only (tables), not over the time range.
    """

    expr: str
    legend: str = ""
    instant: bool = False


@dataclass(frozen=True)
class Panel:
    """One panel.

    Attributes:
        title: Its title.
        kind: Grafana panel type (``timeseries``, ``stat``, ``table``).
        unit: Grafana unit of the values.
        targets: Its queries.
        description: What it shows (the panel's info tooltip).
        width: Grid width (of 24).
        stack: Stack the series (``normal``) or not (``none``).
        repeat: A variable to repeat the panel for, one per value.
        gpu: A GPU panel (DCGM series; no data without NVIDIA GPUs).
        options: Extra panel options.
    """

    title: str
    kind: str
    unit: str
    targets: tuple[Target, ...]
    description: str = ""
    width: int = 12
    stack: str = "none"
    repeat: str | None = None
    gpu: bool = False
    options: dict[str, Any] = field(default_factory=dict)


PANELS: tuple[Panel | str, ...] = (  # a string starts a row
    "Fleet",
    Panel("Fleet power by node", "timeseries", "watt",
          (Target(f"sum by (Hostname) (dtpo_device_power_watts{{{SEL}}})", "{{Hostname}}"),),
          "Mean power of every measured device (GPUs, CPU packages, DRAM) over each rank's latest window, summed "
          "per node.", stack="normal"),
    Panel("Fleet power by kind and source", "timeseries", "watt",
          (Target(f"sum by (kind, source) (dtpo_device_power_watts{{{SEL}}})", "{{kind}} ({{source}})"),),
          "Power by device kind and where it comes from: nvml-counter/nvml-polled (GPUs), rapl (CPU and DRAM "
          "counters) or modelled (an estimate where no counter exists).", stack="normal"),
    Panel("Energy per run", "stat", "joule",
          (Target(f"sum by (run_id) (dtpo_device_energy_joules_total{{{SEL}}})", "{{run_id}}"),),
          "Energy of every measured device over the run's measured (post warm-up) steps.", width=8),
    Panel("Throughput", "timeseries", "short",
          (Target(THROUGHPUT, "{{run_id}} samples/s"),),
          "Samples per second of all ranks over their latest windows.", width=8),
    Panel("Throughput per watt", "timeseries", "short",
          (Target(f"{THROUGHPUT} / {POWER}", "{{run_id}} samples/J"),),
          "Samples per joule: the run's throughput over its measured power.", width=8),
    Panel("Energy per sample", "timeseries", "joule",
          (Target(f"{POWER} / {THROUGHPUT}", "{{run_id}} (fleet)"),
           Target(f"dtpo_energy_per_sample_joules{{{RANK_SEL}}}", "rank {{rank}}")),
          "Joules per sample of the whole run, and of each rank's own devices (local rank 0 also counts its "
          "node's CPU and DRAM)."),
    Panel("Energy estimated (1 = modelled)", "stat", "short",
          (Target(f"max by (run_id) (dtpo_estimated{{{SEL}}})", "{{run_id}}"),),
          "1 when some energy figure comes from a model rather than a hardware counter.", width=6),
    Panel("Runs", "table", "short",
          (Target(f"dtpo_run_info{{{SEL}}}", "", instant=True),),
          "Every rank of the selected runs: workload, world size, strategy, restart attempt.", width=6),
    "Ranks",
    Panel("Step time per rank", "timeseries", "s",
          (Target(f"dtpo_step_seconds{{{RANK_SEL}}}", "rank {{rank}}"),),
          "Wall time of each rank's latest optimizer step."),
    Panel("Throughput per rank", "timeseries", "short",
          (Target(f"dtpo_throughput_samples_per_second{{{RANK_SEL}}}", "rank {{rank}}"),),
          "Samples per second of each rank over its latest window."),
    Panel("Step breakdown, rank $rank", "timeseries", "percentunit",
          (Target(f"dtpo_step_share{{{RANK_SEL}}}", "{{part}}"),),
          "Where the rank's step time went over its latest window: waiting for data, compute, the tail "
          "(exposed communication + waiting for slower ranks) and the optimizer.", width=8, stack="normal",
          repeat="rank"),
    Panel("Sync wait per rank", "timeseries", "s",
          (Target(f"dtpo_sync_wait_seconds{{{RANK_SEL}}}", "rank {{rank}} ({{basis}})"),),
          "Mean wait per step over the latest window. basis=slack: the wait for the slowest rank, learned online "
          "(--tune stragglers); basis=tail: the communication tail, exposed communication + sync wait (an upper "
          "bound of the wait)."),
    Panel("Knob settings", "timeseries", "short",
          (Target(f"dtpo_knob_setting{{{RANK_SEL}}}", "{{knob}} rank {{rank}}"),),
          "Numeric knobs in force: gradient accumulation, GPU power limit (W), locked SM clock (MHz, 0 = "
          "floating)."),
    Panel("Knob choices", "table", "short",
          (Target(f"dtpo_knob_choice{{{RANK_SEL}}} == 1", "", instant=True),),
          "Precision and gradient compression in force on each rank.", width=6),
    Panel("Tuner state", "table", "short",
          (Target(f"dtpo_tuner_state{{{RANK_SEL}}} == 1", "", instant=True),),
          "Each tuner's phase on each rank (wait, warmup, profile[:knob], hold; stragglers: free or slowed; "
          "rebalance: even, rebalanced or slowed; none: no tuner).", width=6),
    Panel("Batch share per rank", "timeseries", "short",
          (Target(BATCH_SHARE, "rank {{rank}}"),),
          "Samples per step of each rank: its share of the global batch as the rebalancer set it (--tune "
          "rebalance, dtpo_batch_share); in a run without it (or before its first window), the samples per "
          "optimizer step each rank processed over the rate interval."),
    GPU_ROW,
    Panel("GPU power", "timeseries", "watt",
          (Target(f"DCGM_FI_DEV_POWER_USAGE{{{SEL}}}", "{{Hostname}} gpu {{gpu}}"),),
          "NVML's power reading of each GPU, once a window.", width=6, gpu=True),
    Panel("GPU power limit", "timeseries", "watt",
          (Target(f"DCGM_FI_DEV_POWER_MGMT_LIMIT{{{SEL}}}", "{{Hostname}} gpu {{gpu}}"),),
          "The power limit in force on each GPU.", width=6, gpu=True),
    Panel("GPU SM clock", "timeseries", "rotmhz",
          (Target(f"DCGM_FI_DEV_SM_CLOCK{{{SEL}}}", "{{Hostname}} gpu {{gpu}}"),),
          "The SM clock of each GPU, once a window.", width=6, gpu=True),
    Panel("GPU energy counter", "timeseries", "joule",
          (Target(f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{SEL}}} / 1000", "{{Hostname}} gpu {{gpu}}"),),
          "Each GPU's energy counter (since the driver loaded), in joules.", width=6, gpu=True),
)


def _variable(name: str, query: str, label: str) -> dict[str, Any]:
    return {"name": name, "label": label, "type": "query", "datasource": DATASOURCE,
            "query": {"query": query, "refId": f"var-{name}"}, "definition": query, "refresh": 2,
            "includeAll": True, "multi": True, "allValue": ".*", "sort": 1,
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]}}


def _panel(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    targets = []
    for i, target in enumerate(panel.targets):
        entry: dict[str, Any] = {"datasource": DATASOURCE, "expr": target.expr, "legendFormat": target.legend,
                                 "refId": chr(ord("A") + i), "range": not target.instant,
                                 "instant": target.instant}
        if target.instant:
            entry["format"] = "table"
        targets.append(entry)
    out: dict[str, Any] = {
        "id": panel_id, "type": panel.kind, "title": panel.title, "description": panel.description,
        "datasource": DATASOURCE, "gridPos": {"h": 8, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []}, "targets": targets,
        "options": dict(panel.options)}
    if panel.kind == "timeseries":
        out["fieldConfig"]["defaults"]["custom"] = {"stacking": {"mode": panel.stack, "group": "A"},
                                                    "fillOpacity": 30 if panel.stack != "none" else 0}
        out["options"].setdefault("legend", {"displayMode": "list", "placement": "bottom", "showLegend": True})
        out["options"].setdefault("tooltip", {"mode": "multi", "sort": "desc"})
    elif panel.kind == "stat":
        out["options"].setdefault("reduceOptions", {"calcs": ["lastNotNull"], "fields": "", "values": False})
    elif panel.kind == "table":
        out["transformations"] = [{"id": "organize", "options": {"excludeByName": {"Time": True, "__name__": True,
                                                                                  "Value": panel.title != "Runs"}}}]
    if panel.repeat:
        out["repeat"] = panel.repeat
        out["repeatDirection"] = "h"
        out["maxPerRow"] = 3
    if panel.gpu:
        out["description"] += " GPU panel: dcgm-exporter's metric names; no data without NVIDIA GPUs."
    return out


def build_dashboard() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (import it, or provision it from a file)."""
    panels: list[dict[str, Any]] = []
    x = y = 0
    height = 8
    for number, item in enumerate(PANELS, start=1):
        if isinstance(item, str):
            if x:
                x, y = 0, y + height
            panels.append({"id": number, "type": "row", "title": item, "collapsed": False,
                           "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
            y += 1
            continue
        if x + item.width > 24:
            x, y = 0, y + height
        panels.append(_panel(item, number, x, y))
        x += item.width
    templating = [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0, "refresh": 1},
        _variable("run_id", "label_values(dtpo_run_info, run_id)", "Run"),
        _variable("Hostname", 'label_values(dtpo_run_info{run_id=~"$run_id"}, Hostname)', "Node"),
        _variable("rank", 'label_values(dtpo_run_info{run_id=~"$run_id", Hostname=~"$Hostname"}, rank)', "Rank"),
    ]
    return {
        "uid": UID, "title": TITLE, "tags": ["dtpo", "energy", "training"], "schemaVersion": SCHEMA_VERSION,
        "version": 1, "editable": True, "graphTooltip": 1, "refresh": "10s", "timezone": "",
        "time": {"from": "now-30m", "to": "now"}, "templating": {"list": templating},
        "annotations": {"list": []}, "links": [], "panels": panels,
        "description": "Live metrics of dtpo training runs: power, energy, throughput per watt, each rank's step "
                       "breakdown and sync wait, knobs and tuners (dtpo train --metrics-addr).",
    }


def dashboard_json(dashboard: dict[str, Any] | None = None) -> str:
    """The dashboard as the text ``dtpo dashboard`` writes (and ``dashboards/dtpo.json`` holds)."""
    return json.dumps(build_dashboard() if dashboard is None else dashboard, indent=2) + "\n"


def dashboard_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """Every query of a dashboard, as ``(panel title, PromQL)``, in panel order (rows have none)."""
    return [(panel.get("title", ""), target["expr"]) for panel in dashboard.get("panels", [])
            for target in panel.get("targets", []) if target.get("expr")]


VARIABLE_DEFAULTS = {"run_id": ".*", "Hostname": ".*", "rank": ".*", "__rate_interval": "1m", "__interval": "15s"}


def resolve_query(expr: str, values: dict[str, str] | None = None) -> str:
    """A dashboard query with its variables filled in, for Prometheus's own API (Grafana does this itself).

    Args:
        expr: PromQL with ``$name`` or ``${name}`` variables.
        values: Values by variable name (default: every filter at "All", :data:`VARIABLE_DEFAULTS`).
    """
    table = {**VARIABLE_DEFAULTS, **(values or {})}
    return re.sub(r"\$\{?(\w+)\}?", lambda m: table.get(m.group(1), m.group(0)), expr)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (``DCGM_*`` and ``dtpo_*``)."""
    return set(re.findall(r"\b(DCGM_FI_[A-Z_]+|dtpo_[a-z_]+)\b", expr))
