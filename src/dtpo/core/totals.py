"""Run-level figures computed from all ranks' per-step breakdowns.

Two things need every rank's steps at once, so they are done here rather than on each rank:

* **Sync wait.** After its last gradient bucket is ready a rank waits in the collective until the slowest
  rank's bucket arrives. Ranks leave the previous step's collective together, so the rank that became ready
  latest sets the pace: ``sync_wait = latest_ready - my_ready`` where ``ready`` is the time from leaving the
  previous collective to this step's last bucket (previous optimizer + data wait + compute). What remains of
  the tail is communication not hidden behind backward. Gathering the numbers once at the end costs the
  hot loop nothing, unlike a per-step all-gather.
* **Totals**: throughput, MFU, communication overhead, synchronisation latency, each a
  :class:`~dtpo.core.measurement.Measurement`, over the steps every rank recorded; and energy, where every
  per-sample figure counts joules and samples over the same steps (a rank killed mid-run leaves an older
  partial record than its peers: its steps and the others' energy must not be mixed).
"""

from __future__ import annotations

import datetime as _dt
import os
import statistics
from typing import Any

from dtpo.core.measurement import Measurement
from dtpo.core.record import EnergyTotals, RankRecord, Restart, RunRecord, StepRecord, load_partial_records

BREAKDOWN_PARTS = ("data_wait_s", "compute_s", "comm_exposed_s", "sync_wait_s", "optimizer_s")


def ready_s(step: StepRecord, previous: StepRecord | None) -> float:
    """Seconds from leaving the previous step's collective to this step's last gradient bucket."""
    return (previous.optimizer_s if previous is not None else 0.0) + step.data_wait_s + step.compute_s


def sync_waits(ready: list[float], tails: list[float | None]) -> list[float | None]:
    """Each rank's wait for the slowest one in one step (``None`` where its tail was not measured): the
    latest-ready rank sets the pace, and nobody waits longer than its own tail."""
    latest = max(ready)
    return [None if tail is None else min(max(latest - mine, 0.0), tail)
            for mine, tail in zip(ready, tails, strict=True)]


def split_tail(ranks: list[RankRecord]) -> None:
    """Fill ``sync_wait_s`` and ``comm_exposed_s`` of every step that all ranks recorded."""
    if not ranks:
        return
    count = min(len(r.steps) for r in ranks)
    for i in range(count):
        ready = [ready_s(r.steps[i], r.steps[i - 1] if i > 0 else None) for r in ranks]
        waits = sync_waits(ready, [r.steps[i].tail_s for r in ranks])
        for r, wait in zip(ranks, waits, strict=True):
            step = r.steps[i]
            if wait is None or step.tail_s is None:
                continue
            step.sync_wait_s = wait
            step.comm_exposed_s = step.tail_s - wait


def measured_steps(rank: RankRecord) -> list[StepRecord]:
    """The steps that count: warm-up steps excluded."""
    return [s for s in rank.steps if not s.warmup]


def compute_totals(ranks: list[RankRecord]) -> dict[str, Measurement]:
    """Run-level figures by name (empty when no step was measured).

    Every figure is taken over the measured steps that every rank recorded, so samples, time and FLOPs
    of all ranks cover the same steps. When ranks recorded different numbers of steps (a rank was killed
    and its last partial record is older), ``measured_steps`` says how many each recorded.
    """
    per_rank = [measured_steps(r) for r in ranks]
    count = min((len(s) for s in per_rank), default=0)
    if count == 0:
        return {}
    counts = [len(s) for s in per_rank]
    per_rank = [s[:count] for s in per_rank]
    walls = [sum(s.step_s for s in steps) for steps in per_rank]
    wall = max(walls)
    samples = sum(s.samples for steps in per_rank for s in steps)
    steps_note = "" if len(set(counts)) == 1 else (
        "steps every rank recorded; " + ", ".join(f"rank {r.rank} recorded {n}" for r, n in zip(ranks, counts,
                                                                                                  strict=True)))
    totals: dict[str, Measurement] = {
        "measured_steps": Measurement(count, "steps", "measured", steps_note),
        "wall_s": Measurement(wall, "s"),
        "samples": Measurement(samples, "samples"),
        "throughput": Measurement(samples / wall if wall > 0 and samples else None, "samples/s", "derived",
                                  "" if samples or wall <= 0 else
                                  f"samples not counted (batches not from a torch DataLoader; DTPO_SAMPLES_PER_STEP "
                                  f"sets them): {count / wall:.4g} steps/s"),
        "throughput_per_worker": Measurement(samples / wall / len(ranks) if wall > 0 and samples else None,
                                             "samples/s", "derived"),
        "step_time_s": Measurement(statistics.median(max(col) for col in _columns(per_rank, "step_s")), "s",
                                   "derived", "median over steps of the slowest rank's step"),
    }
    for part in BREAKDOWN_PARTS:
        values = [getattr(s, part) for steps in per_rank for s in steps]
        if any(v is None for v in values):
            totals[f"{part[:-2]}_fraction"] = Measurement(None, "fraction", "derived",
                                                          "not measured with this strategy")
            continue
        total_wall = sum(walls)
        totals[f"{part[:-2]}_fraction"] = Measurement(sum(values) / total_wall if total_wall > 0 else None,
                                                      "fraction", "derived")
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
    return totals


def energy_totals(ranks: list[RankRecord], settings: dict[str, Any], completed: bool = True,
                  window_steps: int | None = None) -> EnergyTotals | None:
    """Run-level energy: what every rank measured, with power, per-sample, kWh, emissions and cost.

    ``energy_j`` and ``average_power_w`` sum every rank's run window (each over the time that rank
    measured). ``energy_per_sample_j`` counts energy and samples over the same steps: the energy windows
    that end, on every rank that measured energy, at a step every rank recorded; samples of all ranks over
    those steps. In a run that did not complete, a window shorter than the others was closed when the rank
    stopped, possibly mid-step or while it hung on a dead peer, so it is left out of the per-sample figure.

    Args:
        ranks: Rank records; those with an ``energy`` section count.
        settings: The run's energy settings (``grid_g_per_kwh``, ``price_per_kwh``, ``currency``).
        completed: Whether the run completed (every rank closed its last window right after its last step).
        window_steps: Steps per window (the session's setting; default: the longest window recorded).

    Returns:
        ``None`` when no rank measured energy.
    """
    measured = [r for r in ranks if r.energy and (r.energy.get("run") or r.energy.get("windows"))]
    if not measured:
        return None
    total_j = 0.0
    time_s = 0.0
    by_source: dict[str, float] = {}
    estimated = False
    for rank in measured:
        spans = [rank.energy["run"]] if rank.energy.get("run") else list(rank.energy.get("windows") or [])
        for span in spans:
            total_j += span["total_j"]
            estimated = estimated or bool(span.get("estimated"))
            for device, joules in span["energy_j"].items():
                source = span["sources"].get(device, "unknown")
                by_source[source] = by_source.get(source, 0.0) + joules
        time_s = max(time_s, sum(span["time_s"] for span in spans))
    lost = {f"rank{r.rank}/{dev}": why for r in ranks if r.energy for dev, why in r.energy.get("lost", {}).items()}
    measured_ranks = {r.rank for r in measured}
    for r in ranks:
        if r.rank not in measured_ranks:
            lost[f"rank{r.rank}"] = "left no energy measurement (it ended before writing one); its devices are " \
                                    "not counted"
    source: Any = "estimated" if estimated else "measured"
    note = "from " + ", ".join(f"{k} {v:.1f} J" for k, v in sorted(by_source.items()))
    kwh = total_j / 3.6e6
    grid = settings.get("grid_g_per_kwh", 475.0)
    price = settings.get("price_per_kwh")
    return EnergyTotals(
        energy_j=Measurement(total_j, "J", source, note),
        average_power_w=Measurement(total_j / time_s if time_s > 0 else None, "W", source),
        energy_per_sample_j=_energy_per_sample(ranks, measured, window_steps, completed, source),
        kwh=Measurement(kwh, "kWh", source),
        co2_g=Measurement(kwh * grid, "g CO2e", "estimated", f"grid intensity {grid:g} g CO2e/kWh"),
        cost=(Measurement(kwh * price, settings.get("currency", "USD"), source, f"{price:g} per kWh")
              if price is not None else None),
        by_source_j=by_source, time_s=time_s, lost=lost)


def _energy_per_sample(ranks: list[RankRecord], measured: list[RankRecord], window_steps: int | None,
                       completed: bool, source: Any) -> Measurement:
    """Joules per sample with energy and samples over the same steps (see :func:`energy_totals`)."""
    unit = "J/sample"
    windows = {r.rank: list(r.energy.get("windows") or []) for r in measured}  # type: ignore[union-attr]
    lengths = [w["last_step"] - w["first_step"] + 1 for ws in windows.values() for w in ws]
    full = window_steps or max(lengths, default=0)
    if not completed:
        windows = {k: [w for w in ws if w["last_step"] - w["first_step"] + 1 >= full] for k, ws in windows.items()}
    recorded = [max((s.step for s in measured_steps(r)), default=None) for r in ranks]
    if any(last is None for last in recorded):
        return Measurement(None, unit, source, "a rank recorded no measured step")
    ends = set.intersection(*({w["last_step"] for w in ws} for ws in windows.values()))
    ends = {e for e in ends if e <= min(recorded)}  # type: ignore[type-var]
    if not ends:
        return Measurement(None, unit, source, "no energy window ends within the steps every rank recorded")
    last = max(ends)
    joules = sum(w["total_j"] for ws in windows.values() for w in ws if w["last_step"] <= last)
    first = min(w["first_step"] for ws in windows.values() for w in ws)
    samples = sum(s.samples for r in ranks for s in measured_steps(r) if first <= s.step <= last)
    if samples <= 0:
        return Measurement(None, unit, source, "no samples in the energy-measured steps")
    note = f"steps {first}-{last}, {samples} samples"
    missing = [r.rank for r in ranks if r.rank not in windows]
    if missing:
        note += "; without the devices of rank(s) " + ", ".join(map(str, missing))
    return Measurement(joules / samples, unit, source, note)


def finalize(record: RunRecord) -> RunRecord:
    """Split tails into sync wait and exposed communication, then compute totals and energy, in place."""
    split_tail(record.ranks)
    record.totals = compute_totals(record.ranks)
    record.energy = energy_totals(record.ranks, record.config.get("energy", {}),
                                  completed=record.status == "completed",
                                  window_steps=record.config.get("session", {}).get("window_steps"))
    return record


def _columns(per_rank: list[list[StepRecord]], field: str) -> list[list[float]]:
    return [list(col) for col in zip(*[[getattr(s, field) for s in steps] for steps in per_rank], strict=True)]


def _mfu(ranks: list[RankRecord], per_rank: list[list[StepRecord]], walls: list[float]) -> Measurement:
    """Model FLOPs utilisation: FLOPs done per second over the devices' peak, averaged over ranks.

    A utilisation above 100 % cannot be true (the peak was measured or looked up for other kernels than
    the step ran): MFU is then reported unknown with the figure in the note, never as a number.
    """
    values = []
    sources = set()
    for rank, steps, wall in zip(ranks, per_rank, walls, strict=True):
        peak = rank.peak_flops
        if not rank.flops_per_step or peak is None or not peak.value or wall <= 0:
            return Measurement(None, "fraction", "derived", "FLOPs or peak unknown")
        value = rank.flops_per_step * len(steps) / wall / peak.value
        if value > 1.0:
            return Measurement(None, "fraction", "derived",
                               f"rank {rank.rank} came out at {100 * value:.0f}% of its peak ({peak.note or 'peak'}), "
                               "which cannot be true: the peak does not describe the kernels the step ran")
        values.append(value)
        sources.add(peak.note)
    return Measurement(statistics.fmean(values), "fraction", "derived", "; ".join(sorted(s for s in sources if s)))


def record_from_partials(run_dir: str | os.PathLike[str], status: str, error: str | None,
                         partials: list[RunRecord] | None = None,
                         rank_errors: dict[int, str] | None = None) -> RunRecord | None:
    """Assemble a run record from the partial records the ranks of this node left behind.

    Used when a run did not end with rank 0 writing ``record.json`` (a worker crashed or was killed), so
    that what was measured is not lost.

    Args:
        run_dir: The run directory.
        status: The run's status.
        error: The run's error, if known (else the first rank's).
        partials: The latest attempt's partial records, when the caller already read them.
        rank_errors: What ended some ranks, by rank, where the launcher knows better than their own records (a
            rank the OOM killer ended left no word: "out of memory (...)" instead of :data:`SILENT_RANK`).
    """
    if partials is None:
        partials = load_partial_records(run_dir)
    if not partials:
        return None
    mark_silent_ranks(partials, rank_errors)
    first = partials[0]
    record = RunRecord(first.run_id, status, first.started_at,
                       finished_at=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                       config=first.config, environment=first.environment,
                       ranks=sorted((p.ranks[0] for p in partials if p.ranks), key=lambda r: r.rank),
                       error=error or next((p.error for p in partials if p.error), None),
                       attempt=first.attempt, restarts=first.restarts,
                       resumed=next((p.resumed for p in partials if p.resumed), None))
    return finalize(record)


SILENT_RANK = "stopped without writing its end (killed: SIGKILL, out of memory, or its node was lost)"


def mark_silent_ranks(partials: list[RunRecord], known: dict[int, str] | None = None) -> None:
    """A rank whose partial record still says ``running`` after its attempt ended was killed before it could
    write anything: say so on its rank record instead of leaving it looking alive, with what ended it where that is
    ``known`` (by rank: the launcher saw the OOM killer end it), else :data:`SILENT_RANK`. A known cause replaces a
    rank's own words too (an allocation error becomes "out of memory: ...")."""
    known = known or {}
    for partial in partials:
        for rank in partial.ranks:
            if rank.rank in known:
                rank.error = known[rank.rank]
            elif partial.status == "running":
                rank.error = rank.error or SILENT_RANK


def attempt_summary(partials: list[RunRecord], attempt: int, status: str, error: str | None) -> Restart:
    """One earlier attempt of a restarted run, from the partial records its ranks left.

    Args:
        partials: That attempt's partial records.
        attempt: Its number.
        status: How it ended (from the launcher's view: ``failed`` unless a signal or divergence ended it).
        error: Its first real error as the launcher saw it, if known.
    """
    mark_silent_ranks(partials)
    ranks = [r for p in partials for r in p.ranks]
    steps = min((len(r.steps) for r in ranks), default=None)
    time_s = max((sum(s.step_s for s in r.steps) for r in ranks), default=None)
    windows = [w for r in ranks if r.energy for w in r.energy.get("windows", [])]
    energy = sum(w["total_j"] for w in windows) if windows else None
    estimated = any(w.get("estimated") for w in windows)
    real_errors = [e for e in (error, *(p.error for p in partials)) if e]
    return Restart(attempt=attempt, status=status, error=real_errors[0] if real_errors else None, steps=steps,
                   time_s=Measurement(time_s, "s", "measured", "sum of the slowest rank's recorded steps"),
                   energy_j=Measurement(energy, "J", "estimated" if estimated else "measured",
                                        "energy windows the ranks recorded before the attempt ended"),
                   started_at=partials[0].started_at if partials else None)


def add_recovery(restart: Restart, failed: list[RunRecord], resumed: dict[str, Any] | None,
                 following: list[RankRecord]) -> Restart:
    """What the failure of one attempt cost the next one, on its :class:`Restart` (in place).

    Args:
        restart: The failed attempt's summary (:func:`attempt_summary`).
        failed: That attempt's partial records.
        resumed: The next attempt's ``RunRecord.resumed`` (``None``: it started from the beginning).
        following: The next attempt's rank records.

    Fills ``reached_step`` (the furthest step a rank of the failed attempt recorded: a rank killed outright
    flushed its record earlier than the others; ``steps`` and ``time_s`` are raised to match it),
    ``resumed_from_step``, ``steps_lost`` (done again),
    ``recovery_s`` (from the failed attempt's last recorded step to the next attempt's end of the step the
    failure happened at, or to its first step when nothing was lost) and ``recovery_energy_j`` (that time at the
    next attempt's average power, estimated).
    """
    ranks = [r for p in failed for r in p.ranks]
    reached = max((r.steps[-1].step + 1 for r in ranks if r.steps), default=None)
    start = int(resumed["step"]) if resumed else 0
    restart.reached_step = reached
    restart.resumed_from_step = start
    if reached is None:
        return restart
    # A rank killed outright left a partial record from its last flush: the attempt got as far as its furthest
    # rank, and ran from its first step's start to the furthest recorded end.
    restart.steps = max(restart.steps or 0, reached)
    starts = [s.started_at for r in ranks for s in r.steps[:1] if s.started_at is not None]
    finishes = [s.started_at + s.step_s for r in ranks for s in r.steps[-1:] if s.started_at is not None]
    if starts and finishes:
        restart.time_s = Measurement(max(finishes) - min(starts), "s", "measured",
                                     "from the first step's start to the last recorded step's end, any rank")
    restart.steps_lost = max(0, reached - start)
    ends = [s.started_at + s.step_s for r in ranks for s in r.steps[-1:] if s.started_at is not None]
    begun = max(ends) if ends else (resumed or {}).get("started_unix")
    if reached > start:
        done = [s.started_at + s.step_s for r in following for s in r.steps
                if s.step == reached - 1 and s.started_at is not None]
        what = f"until step {reached - 1} was done again"
    else:
        done = [r.steps[0].started_at for r in following if r.steps and r.steps[0].started_at is not None]
        what = "until the next attempt's first step"
    if begun is None or not done:
        return restart
    seconds = max(max(done) - begun, 0.0)
    restart.recovery_s = Measurement(seconds, "s", "measured", f"from the failed attempt's last recorded step {what}")
    power = _average_power_w(following)
    if power is not None:
        restart.recovery_energy_j = Measurement(seconds * power, "J", "estimated",
                                                f"recovery time at the next attempt's average power ({power:.1f} W)")
    return restart


def _average_power_w(ranks: list[RankRecord]) -> float | None:
    """The summed average power of ranks over their energy windows (``None`` without any)."""
    total = 0.0
    found = False
    for rank in ranks:
        windows = (rank.energy or {}).get("windows") or []
        time_s = sum(w["time_s"] for w in windows)
        if time_s > 0:
            total += sum(w["total_j"] for w in windows) / time_s
            found = True
    return total if found else None


def energy_of_all_attempts(record: RunRecord) -> Measurement | None:
    """The energy of a restarted run over every attempt: the earlier attempts' (from :attr:`RunRecord.restarts`)
    plus this one's; ``None`` when the run was not restarted or an attempt's energy is unknown. It is *estimated*
    when any part is."""
    if not record.restarts or record.energy is None or record.energy.energy_j.value is None:
        return None
    parts = [record.energy.energy_j, *(r.energy_j for r in record.restarts)]
    if any(m is None or m.value is None for m in parts):
        return None
    source = "estimated" if any(m.source == "estimated" for m in parts) else "measured"  # type: ignore[union-attr]
    return Measurement(sum(float(m.value) for m in parts), "J", source,  # type: ignore[union-attr,arg-type]
                       f"{len(parts)} attempts, including the {len(parts) - 1} that failed")
