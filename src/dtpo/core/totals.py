"""Run-level figures computed from all ranks' per-step breakdowns.

Two things need every rank's steps at once, so they are done here rather than on each rank:

* **Sync wait.** After its last gradient bucket is ready a rank waits in the collective until the slowest
  rank's bucket arrives. Ranks leave the previous step's collective together, so the rank that became ready
  latest sets the pace: ``sync_wait = latest_ready - my_ready`` where ``ready`` is the time from leaving the
  previous collective to this step's last bucket (previous optimizer + data wait + compute). What remains of
  the tail is communication not hidden behind backward. Gathering the numbers once at the end costs the
  hot loop nothing, unlike a per-step all-gather.
* **Totals**: throughput, MFU, communication overhead, synchronisation latency, each a
  :class:`~dtpo.core.measurement.Measurement`.
"""

from __future__ import annotations

import datetime as _dt
import os
import statistics
from typing import Any

from dtpo.core.measurement import Measurement
from dtpo.core.record import RankRecord, RunRecord, StepRecord, load_partial_records

BREAKDOWN_PARTS = ("data_wait_s", "compute_s", "comm_exposed_s", "sync_wait_s", "optimizer_s")


def split_tail(ranks: list[RankRecord]) -> None:
    """Fill ``sync_wait_s`` and ``comm_exposed_s`` of every step that all ranks recorded."""
    if not ranks:
        return
    count = min(len(r.steps) for r in ranks)
    for i in range(count):
        ready = []
        for r in ranks:
            step = r.steps[i]
            before = r.steps[i - 1].optimizer_s if i > 0 else 0.0
            ready.append(before + step.data_wait_s + step.compute_s)
        latest = max(ready)
        for r, my_ready in zip(ranks, ready, strict=True):
            step = r.steps[i]
            if step.tail_s is None:
                continue
            wait = min(max(latest - my_ready, 0.0), step.tail_s)
            step.sync_wait_s = wait
            step.comm_exposed_s = step.tail_s - wait


def measured_steps(rank: RankRecord) -> list[StepRecord]:
    """The steps that count: warm-up steps excluded."""
    return [s for s in rank.steps if not s.warmup]


def compute_totals(ranks: list[RankRecord]) -> dict[str, Any]:
    """Run-level figures as a dict of :class:`Measurement` dicts (empty when no step was measured)."""
    per_rank = [measured_steps(r) for r in ranks]
    count = min((len(s) for s in per_rank), default=0)
    if count == 0:
        return {}
    per_rank = [s[:count] for s in per_rank]
    walls = [sum(s.step_s for s in steps) for steps in per_rank]
    wall = max(walls)
    samples = sum(s.samples for steps in per_rank for s in steps)
    totals: dict[str, Measurement] = {
        "measured_steps": Measurement(count, "steps"),
        "wall_s": Measurement(wall, "s"),
        "samples": Measurement(samples, "samples"),
        "throughput": Measurement(samples / wall, "samples/s", "derived"),
        "throughput_per_worker": Measurement(samples / wall / len(ranks), "samples/s", "derived"),
        "step_time_s": Measurement(statistics.median(max(col) for col in _columns(per_rank, "step_s")), "s",
                                   "derived", "median over steps of the slowest rank's step"),
    }
    for part in BREAKDOWN_PARTS:
        values = [getattr(s, part) for steps in per_rank for s in steps]
        if any(v is None for v in values):
            totals[f"{part[:-2]}_fraction"] = Measurement(None, "fraction", "derived",
                                                          "not measured with this strategy")
            continue
        totals[f"{part[:-2]}_fraction"] = Measurement(sum(values) / sum(walls), "fraction", "derived")
    totals["comm_overhead"] = Measurement(totals["comm_exposed_fraction"].value, "fraction", "derived",
                                          "share of step time in collectives not hidden behind backward")
    waits = [s.sync_wait_s for steps in per_rank for s in steps]
    totals["sync_latency_s"] = (Measurement(statistics.fmean(waits), "s", "derived",
                                            "mean time per step a rank waited for the slowest rank")
                                if None not in waits else Measurement(None, "s", "derived",
                                                                      "not measured with this strategy"))
    totals["mfu"] = _mfu(ranks, per_rank, walls)
    losses = [s.loss for s in ranks[0].steps if s.loss is not None]
    if losses:
        totals["loss_first"] = Measurement(losses[0], "loss")
        totals["loss_last"] = Measurement(losses[-1], "loss")
    return {k: v.to_dict() for k, v in totals.items()}


def energy_totals(ranks: list[RankRecord], samples: float | None, settings: dict[str, Any]) -> dict[str, Any] | None:
    """Run-level energy: every rank's run window summed, with power, per-sample, kWh, emissions and cost.

    Args:
        ranks: Rank records whose ``energy`` sections hold a ``run`` window.
        samples: Samples processed in the measured steps (all ranks).
        settings: The run's energy settings (``grid_g_per_kwh``, ``price_per_kwh``, ``currency``).
    """
    runs = [r.energy["run"] for r in ranks if r.energy and r.energy.get("run")]
    if not runs:
        return None
    total_j = sum(run["total_j"] for run in runs)
    time_s = max(run["time_s"] for run in runs)
    by_source: dict[str, float] = {}
    for run in runs:
        for device, joules in run["energy_j"].items():
            source = run["sources"][device]
            by_source[source] = by_source.get(source, 0.0) + joules
    estimated = any(run["estimated"] for run in runs)
    source: Any = "estimated" if estimated else "measured"
    note = "from " + ", ".join(f"{k} {v:.1f} J" for k, v in sorted(by_source.items()))
    kwh = total_j / 3.6e6
    grid = settings.get("grid_g_per_kwh", 475.0)
    out: dict[str, Measurement] = {
        "energy_j": Measurement(total_j, "J", source, note),
        "average_power_w": Measurement(total_j / time_s if time_s > 0 else None, "W", source),
        "energy_per_sample_j": Measurement(total_j / samples if samples else None, "J/sample", source),
        "kwh": Measurement(kwh, "kWh", source),
        "co2_g": Measurement(kwh * grid, "g CO2e", "estimated", f"grid intensity {grid:g} g CO2e/kWh"),
    }
    price = settings.get("price_per_kwh")
    if price is not None:
        out["cost"] = Measurement(kwh * price, settings.get("currency", "USD"), source, f"{price:g} per kWh")
    lost = {f"rank{r.rank}/{dev}": why for r in ranks if r.energy for dev, why in r.energy.get("lost", {}).items()}
    result: dict[str, Any] = {k: v.to_dict() for k, v in out.items()}
    result.update(by_source_j=by_source, time_s=time_s, lost=lost)
    return result


def finalize(record: RunRecord) -> RunRecord:
    """Split tails into sync wait and exposed communication, then compute totals and energy, in place."""
    split_tail(record.ranks)
    record.totals = compute_totals(record.ranks)
    samples = record.totals.get("samples", {}).get("value")
    record.energy = energy_totals(record.ranks, samples, record.config.get("energy", {}))
    return record


def _columns(per_rank: list[list[StepRecord]], field: str) -> list[list[float]]:
    return [list(col) for col in zip(*[[getattr(s, field) for s in steps] for steps in per_rank], strict=True)]


def _mfu(ranks: list[RankRecord], per_rank: list[list[StepRecord]], walls: list[float]) -> Measurement:
    """Model FLOPs utilisation: FLOPs done per second over the devices' peak, averaged over ranks."""
    values = []
    sources = set()
    for rank, steps, wall in zip(ranks, per_rank, walls, strict=True):
        peak = rank.peak_flops or {}
        if not rank.flops_per_step or not peak.get("value") or wall <= 0:
            return Measurement(None, "fraction", "derived", "FLOPs or peak unknown")
        values.append(rank.flops_per_step * len(steps) / wall / peak["value"])
        sources.add(peak.get("note", ""))
    return Measurement(statistics.fmean(values), "fraction", "derived", "; ".join(sorted(s for s in sources if s)))


def record_from_partials(run_dir: str | os.PathLike[str], status: str, error: str | None) -> RunRecord | None:
    """Assemble a run record from the partial records the ranks of this node left behind.

    Used when a run did not end with rank 0 writing ``record.json`` (a worker crashed or was killed), so
    that what was measured is not lost.
    """
    partials = load_partial_records(run_dir)
    if not partials:
        return None
    first = partials[0]
    record = RunRecord(first.run_id, status, first.started_at,
                       finished_at=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                       config=first.config, environment=first.environment,
                       ranks=sorted((p.ranks[0] for p in partials if p.ranks), key=lambda r: r.rank),
                       error=error or next((p.error for p in partials if p.error), None))
    return finalize(record)
