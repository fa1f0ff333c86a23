"""The key figures the run store keeps for each kind of result, taken from the result's own JSON or record.

Every figure keeps its unit and where it came from (``source``): a train run's figures are the record's
measurements as they are (``measured``, ``derived`` or ``estimated``); a bench's are its rows' measurements,
one per worker count (``throughput@2w``); every figure of ``dtpo simulate`` and ``dtpo plan`` is a model's,
so it is stored as ``estimated`` with a note saying so. The run directory's JSON stays the source of truth:
the same functions turn it into a row at the end of a run and when ``dtpo runs reindex`` rebuilds the store.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from dtpo.core.measurement import Measurement
from dtpo.core.record import EnergyTotals, RunRecord
from dtpo.telemetry.rebalance import shares_over_run

KINDS = ("train", "tune", "bench", "simulate", "plan")
"""What a stored run is: a training run, one whose config tunes a knob, a bench, a simulation or a plan."""

ESTIMATED_SOURCES = frozenset({"estimated", "modelled", "simulated", "predicted"})
"""Sources whose figures come from a model rather than a clock or a counter: shown as estimated."""

SIMULATED_NOTE = "simulated, not measured"
PREDICTED_NOTE = "predicted by dtpo plan, not measured"


@dataclass(frozen=True)
class Figure:
    """One key figure of a stored run.

    Attributes:
        name: Its name (``throughput``, ``energy_j``, ``throughput@2w``, ...).
        value: The number, ``None`` when unknown.
        unit: Its unit.
        source: ``measured``, ``derived``, ``estimated``, ... (see :data:`ESTIMATED_SOURCES`).
        note: Optional detail.
    """

    name: str
    value: float | None
    unit: str = ""
    source: str = "measured"
    note: str = ""

    @property
    def estimated(self) -> bool:
        """Whether the figure comes from a model, not from a clock or a counter."""
        return self.source in ESTIMATED_SOURCES

    def as_measurement(self) -> dict[str, Any]:
        """The figure as a measurement's JSON dict (for :func:`dtpo.telemetry.summary.format_value`)."""
        source = "estimated" if self.estimated else self.source
        return {"value": self.value, "unit": self.unit, "source": source, "note": self.note}


@dataclass
class RunFacts:
    """What the store keeps about one result besides its id, status and times.

    Attributes:
        config: The configuration it ran with, as plain JSON values.
        figures: Its key figures by name.
        workload: The workload's name, if it has one.
        workers: Workers (or GPUs) it ran on; for a bench or a plan the largest count.
        steps: Training steps, if it has them.
    """

    config: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, Figure] = field(default_factory=dict)
    workload: str | None = None
    workers: int | None = None
    steps: int | None = None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def figure(name: str, data: Measurement | dict[str, Any] | None) -> Figure | None:
    """A figure from a measurement or its JSON dict (``None`` for ``None``)."""
    if data is None:
        return None
    if isinstance(data, Measurement):
        return Figure(name, _number(data.value), data.unit, data.source, data.note)
    if not isinstance(data, dict) or "value" not in data:
        return None
    return Figure(name, _number(data.get("value")), str(data.get("unit") or ""), str(data.get("source") or "measured"),
                  str(data.get("note") or ""))


def modelled(name: str, value: Any, unit: str, note: str = SIMULATED_NOTE) -> Figure:
    """A figure from a model (simulation or plan): always estimated."""
    return Figure(name, _number(value), unit, "estimated", note)


def _add(out: dict[str, Figure], item: Figure | None) -> None:
    if item is not None:
        out[item.name] = item


def config_kind(config: dict[str, Any]) -> str:
    """``tune`` for a training config that tunes a knob (``tune.knob`` set), else ``train``."""
    tune = config.get("tune") if isinstance(config, dict) else None
    return "tune" if isinstance(tune, dict) and tune.get("knob") else "train"


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def config_facts(config: dict[str, Any]) -> RunFacts:
    """Workload, workers and steps of a training configuration (a :class:`~dtpo.core.config.RunConfig` dict)."""
    workload = config.get("workload") if isinstance(config.get("workload"), dict) else {}
    launch = config.get("launch") if isinstance(config.get("launch"), dict) else {}
    workers = _int(config.get("world_size")) or _int(launch.get("workers"))
    return RunFacts(config=config, workload=workload.get("name"), workers=workers, steps=_int(workload.get("steps")))


def record_facts(record: RunRecord) -> RunFacts:
    """A train or tune run's facts: every run-level total and energy figure of its record."""
    facts = config_facts(record.config)
    if facts.workers is None and record.ranks:
        facts.workers = len(record.ranks)
    for name, value in record.totals.items():
        _add(facts.figures, figure(name, value))
    energy = record.energy
    if isinstance(energy, EnergyTotals):
        for name in ENERGY_FIGURES:
            _add(facts.figures, figure(name, getattr(energy, name)))
    _rebalance_figures(facts.figures, record)
    return facts


def _rebalance_figures(out: dict[str, Figure], record: RunRecord) -> None:
    """``--tune rebalance``: how many times it changed the shares and the smallest share at the end against the
    even one (what it gained is in the measured throughput)."""
    run = shares_over_run(record)
    if run is None:
        return
    changes = len(run.changes)
    _add(out, Figure("rebalance.share_changes", float(changes), "changes", "derived",
                     "shares stayed even" if not changes else f"last from step {run.changes[-1]['step']}"))
    smallest = min(run.moved(), key=lambda m: m.ratio, default=None)
    _add(out, Figure("rebalance.smallest_share", smallest.ratio if smallest else 1.0, "x even", "derived",
                     f"rank {smallest.rank}'s share at the end over its even one ({smallest.share} of "
                     f"{run.global_batch} samples per step)" if smallest else "every rank at its even share"))


ENERGY_FIGURES = ("energy_j", "average_power_w", "energy_per_sample_j", "kwh", "co2_g", "cost")
"""The figures of a record's :class:`~dtpo.core.record.EnergyTotals` the store keeps."""

BENCH_FIGURES = ("throughput", "scaling_efficiency", "step_time_s", "comm_overhead", "sync_latency_s",
                 "data_wait_fraction", "mfu", "energy_per_sample_j")


def bench_facts(data: dict[str, Any]) -> RunFacts:
    """A bench's facts from its ``bench.json``: every row's figures, named ``NAME@Nw`` for N workers."""
    config = data.get("config") if isinstance(data.get("config"), dict) else {}
    facts = config_facts(config)
    facts.workload = data.get("workload") or facts.workload
    rows = [row for row in data.get("rows") or [] if isinstance(row, dict) and _int(row.get("workers"))]
    for row in rows:
        for name in BENCH_FIGURES:
            _add(facts.figures, figure(f"{name}@{row['workers']}w", row.get(name)))
    if rows:
        facts.workers = max(row["workers"] for row in rows)
    return facts


def simulate_facts(data: dict[str, Any]) -> RunFacts:
    """A simulation's facts from its JSON (a setting or a sweep, ``--tune KNOB`` or ``--tune stragglers``):
    the headline figures (for ``--tune KNOB``, the setting it chose too: ``choice.power_limit_w``,
    ``choice.sm_clock_mhz``), all estimated, noted :data:`SIMULATED_NOTE`."""
    config = dict(data.get("config") or {})
    for key in ("knob", "cost", "gpu", "workload", "batch_size", "calibrated"):
        if key in data:
            config.setdefault(key, data[key])
    facts = RunFacts(config=config, workload=data.get("workload"), workers=_int(config.get("gpus")),
                     steps=_int(config.get("steps")))
    out = facts.figures
    if data.get("knob") == "stragglers":
        for label, key in (("no_tuning", "no_tuning"), ("tuned", "per_rank_slowdown")):
            run = data.get(key) or {}
            _add(out, modelled(f"{label}.joules_per_sample", run.get("joules_per_sample"), "J/sample"))
            _add(out, modelled(f"{label}.time_s", run.get("time_s"), "s"))
            _add(out, modelled(f"{label}.energy_j", run.get("energy_j"), "J"))
        _add(out, modelled("energy_saved_j", data.get("energy_saved_j"), "J"))
        _add(out, modelled("energy_saved_share", data.get("energy_saved_share"), "fraction"))
        _add(out, modelled("slowdown_share", data.get("slowdown_share"), "fraction"))
        _add(out, modelled("bloat_recovered_share", (data.get("bloat") or {}).get("recovered_share"), "fraction"))
    elif isinstance(data.get("result"), dict):  # --tune power-limit / sm-clock / both
        result, unit = data["result"], str(data.get("cost") or "cost")
        choice = result.get("choice") if isinstance(result.get("choice"), dict) else {}
        _add(out, modelled("choice.power_limit_w", choice.get("power_limit_w"), "W") if choice else None)
        if choice.get("sm_clock_mhz") is not None:
            _add(out, modelled("choice.sm_clock_mhz", choice["sm_clock_mhz"], "MHz"))
        for key in ("choice_cost", "oracle_cost", "cost_ratio", "job_cost", "default_job_cost", "oracle_job_cost"):
            _add(out, modelled(key, result.get(key), "ratio" if key == "cost_ratio" else unit))
        _add(out, modelled("profiling_steps", result.get("profiling_steps"), "steps"))
        default, job = _number(result.get("default_job_cost")), _number(result.get("job_cost"))
        if default and job is not None:
            _add(out, modelled("job_cost_vs_default", job / default - 1, "fraction"))
    else:
        _setting_figures(out, data)
    return facts


def _setting_figures(out: dict[str, Figure], data: dict[str, Any]) -> None:
    """One setting against the default, or a sweep's optima."""
    results = [r for r in data.get("results") or [] if isinstance(r, dict)]
    baseline = data.get("baseline") if isinstance(data.get("baseline"), dict) else {}
    units = {"time_s": "s", "energy_j": "J", "average_power_w": "W", "joules_per_sample": "J/sample",
             "samples_per_s": "samples/s", "power_limit_w": "W", "sm_clock_mhz": "MHz"}
    for key in ("joules_per_sample", "samples_per_s"):
        _add(out, modelled(f"default.{key}", baseline.get(key), units[key]))
    if len(results) == 1:
        (result,) = results
        for key in ("time_s", "energy_j", "average_power_w", "joules_per_sample", "samples_per_s", "power_limit_w",
                    "sm_clock_mhz"):
            if result.get(key) is not None:
                _add(out, modelled(key, result.get(key), units[key]))
        _add(out, _against("energy_vs_default", result, baseline, "energy_j"))
        _add(out, _against("time_vs_default", result, baseline, "time_s"))
    elif results:
        valid = [r for r in results if _number(r.get("joules_per_sample")) is not None]
        if valid:
            best = min(valid, key=lambda r: r["joules_per_sample"])
            for key in ("joules_per_sample", "power_limit_w", "sm_clock_mhz", "samples_per_s"):
                if best.get(key) is not None:
                    _add(out, modelled(f"energy_optimal.{key}", best.get(key), units[key]))
            _add(out, _against("energy_optimal.energy_vs_default", best, baseline, "energy_j"))
        fastest = [r for r in results if _number(r.get("samples_per_s")) is not None]
        if fastest:
            best = max(fastest, key=lambda r: r["samples_per_s"])
            for key in ("samples_per_s", "power_limit_w", "sm_clock_mhz", "joules_per_sample"):
                if best.get(key) is not None:
                    _add(out, modelled(f"time_optimal.{key}", best.get(key), units[key]))


def _against(name: str, result: dict[str, Any], baseline: dict[str, Any], key: str) -> Figure | None:
    value, base = _number(result.get(key)), _number(baseline.get(key))
    if value is None or not base:
        return None
    return modelled(name, value / base - 1, "fraction")


def plan_facts(data: dict[str, Any]) -> RunFacts:
    """A plan's facts from its JSON: the first link's throughput, efficiency and J/sample at every GPU count,
    its step time and cost at the largest, and each compared link at the largest (``NAME@Ngpu[LINK]``)."""
    plans = [p for p in data.get("plans") or [] if isinstance(p, dict)]
    facts = RunFacts()
    if not plans:
        return facts
    first = plans[0]
    predictions = [p for p in first.get("predictions") or [] if isinstance(p, dict) and _int(p.get("gpus"))]
    facts.config = {"gpu": first.get("gpu"), "intra_link": first.get("intra_link"),
                    "inter_link": first.get("inter_link"), "calibration": first.get("calibration"),
                    "gpu_counts": [p["gpus"] for p in predictions],
                    "compare_links": [p.get("inter_link") for p in plans[1:]]}
    facts.workers = max((p["gpus"] for p in predictions), default=None)
    out = facts.figures
    for p in predictions:
        _prediction_figures(out, p, f"@{p['gpus']}gpu", full=p is predictions[-1])
    for other in plans[1:]:
        rows = [p for p in other.get("predictions") or [] if isinstance(p, dict) and _int(p.get("gpus"))]
        if rows:
            _prediction_figures(out, rows[-1], f"@{rows[-1]['gpus']}gpu[{other.get('inter_link')}]", full=False)
    return facts


def _prediction_figures(out: dict[str, Figure], p: dict[str, Any], suffix: str, full: bool) -> None:
    note = PREDICTED_NOTE
    _add(out, modelled(f"throughput{suffix}", p.get("throughput"), "samples/s", note))
    _add(out, modelled(f"scaling_efficiency{suffix}", p.get("scaling_efficiency"), "fraction", note))
    _add(out, modelled(f"joules_per_sample{suffix}", p.get("joules_per_sample"), "J/sample", note))
    if not full:
        return
    _add(out, modelled(f"step_s{suffix}", p.get("step_s"), "s", note))
    cost = p.get("cost") if isinstance(p.get("cost"), dict) else {}
    for key, unit in (("hours", "h"), ("kwh", "kWh"), ("co2_kg", "kg CO2e"), ("total", "money")):
        if cost.get(key) is not None:
            _add(out, modelled(f"{'cost' if key == 'total' else key}{suffix}", cost.get(key), unit, note))


def result_facts(kind: str, data: dict[str, Any]) -> RunFacts:
    """The facts of a ``bench``, ``simulate`` or ``plan`` result from its JSON.

    Raises:
        ValueError: Another kind (train and tune runs have a record: :func:`record_facts`).
    """
    readers = {"bench": bench_facts, "simulate": simulate_facts, "plan": plan_facts}
    if kind not in readers:
        raise ValueError(f"no result reader for kind {kind!r}")
    return readers[kind](data if isinstance(data, dict) else {})
