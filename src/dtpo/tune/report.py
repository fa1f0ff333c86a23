"""What a tuning run reports: each setting tried with its interval and fate, what profiling cost against the
default setting, and what holding the choice saves. Plain values for the record and the summary."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dtpo.tune.boundary import chord_estimate
from dtpo.tune.cost import CostContext, CostMetric
from dtpo.tune.setting import GpuSetting, Segment
from dtpo.tune.stats import Estimate, NoiseEstimate, SettingStats, estimate
from dtpo.tune.tuner_types import Candidate


def settings_rows(stats: Iterable[SettingStats], status: Mapping[GpuSetting, tuple[str, str]], noise: NoiseEstimate,
                  metric: CostMetric, context: CostContext, z: float) -> list[dict[str, Any]]:
    """One row per measured setting, from the most power allowed down: figures, cost with its interval of ``z``
    standard errors, and what became of it (``status``: setting -> (status, reason))."""
    rows = []
    for s in sorted(stats, key=lambda s: s.setting.sort_key, reverse=True):
        if not s.measured:
            continue
        st, why = status.get(s.setting, ("measured", ""))
        rows.append(_row(estimate(s, noise, metric, context), s.steps, s.warmup_steps, st, why, z))
    return rows


def _row(est: Estimate, steps: int, warmup_steps: int, status: str, reason: str, z: float) -> dict[str, Any]:
    """One setting's row: its figures, its cost with an interval of ``z`` standard errors, and its fate."""
    return {**est.setting.as_dict(), "steps": steps, "warmup_steps": warmup_steps,
            "time_per_sample_s": est.time_per_sample_s, "energy_per_sample_j": est.energy_per_sample_j,
            "cost": est.cost, "cost_low": est.cost - z * est.cost_se, "cost_high": est.cost + z * est.cost_se,
            "status": status, "reason": reason}


def unprofiled_rows(candidates: Iterable[Candidate], estimates: Mapping[int, Estimate], z: float
                    ) -> list[dict[str, Any]]:
    """Rows like :func:`settings_rows`'s for the settings interpolated between two measured candidates and not
    measured yet (``estimates``: by candidate index), with the figures of their chord."""
    rows = []
    for c in candidates:
        if c.chord is None or c.stats.measured:
            continue
        fast, slow = estimates.get(c.chord.fast.index), estimates.get(c.chord.slow.index)
        if fast is not None and slow is not None:
            rows.append(interpolated_row(chord_estimate(fast, slow, c.chord.fraction, c.stats.setting), c.status,
                                         c.reason, z))
    return rows


def interpolated_row(est: Estimate, status: str, reason: str, z: float) -> dict[str, Any]:
    """A row like :func:`settings_rows`'s for a setting read off the chord of two measured ones (no steps of its own;
    ``interpolated`` marks it)."""
    return {**_row(est, 0, 0, status, reason, z), "interpolated": True}


def profiling_cost(segments: Iterable[Segment], reference: SettingStats | None) -> dict[str, float] | None:
    """Extra time and energy the steps before holding cost against running them at the default setting
    (``reference``, by its measured figures); ``None`` before the default is measured."""
    if reference is None or not reference.measured:
        return None
    spent = [seg for seg in segments if seg.phase != "hold"]
    time_s = sum(seg.time_s for seg in spent)
    energy_j = sum(seg.energy_j for seg in spent)
    samples = sum(seg.samples for seg in spent)
    return {"steps": sum(seg.steps for seg in spent), "time_s": time_s, "energy_j": energy_j,
            "extra_time_s": time_s - samples * reference.time_per_sample_s,
            "extra_energy_j": energy_j - samples * reference.energy_per_sample_j}


def projected_saving(reference: SettingStats | None, chosen: SettingStats | None, metric: CostMetric,
                     context: CostContext, remaining_samples: int) -> dict[str, float] | None:
    """What holding ``chosen`` instead of the default (``reference``) saves over ``remaining_samples``
    (estimates from the measured figures); ``None`` when either is unmeasured."""
    if reference is None or chosen is None or not reference.measured or not chosen.measured:
        return None
    cost_ref, cost_choice = reference.cost(metric, context), chosen.cost(metric, context)
    return {"samples": remaining_samples,
            "time_s": remaining_samples * (reference.time_per_sample_s - chosen.time_per_sample_s),
            "energy_j": remaining_samples * (reference.energy_per_sample_j - chosen.energy_per_sample_j),
            "cost": remaining_samples * (cost_ref - cost_choice),
            "cost_fraction": 1.0 - cost_choice / cost_ref if cost_ref else 0.0}
