"""What a mitigation would have done to a measured power timeline, and what it costs in energy.

Each what-if takes a timeline on a uniform grid (one GPU's, or a job's sum) and returns the power the grid would
have seen instead, with its energy cost (joules beyond the measured timeline's):

* :func:`power_floor`: the GPU never draws less than a share of its power limit (burning the difference);
* :func:`ramp_limiter`: GB200-like power smoothing: power may rise by at most ``ramp_up`` W/s (work above that is
  deferred, not dropped: its energy is spent later and the delay is reported), and when the demand falls power
  holds for ``hysteresis_s``, then falls by at most ``ramp_down`` W/s, never below a floor; the difference is
  dummy work;
* :func:`energy_buffer`: GB300-like energy storage of capacity E between the grid and the GPUs: the grid draws a
  smoothed power (an exponential mean of the demand over ``tau_s``, pulled back towards a half-full store) and the
  store gives or takes the rest within its capacity, losing ``1 - round_trip`` of what passes through it;
* :func:`fill_gaps`: dummy work during the step's communication gaps (from the step marks) up to a share of the
  compute-phase power.

Energy bookkeeping is exact on the grid: a floor and dummy work only add energy; the buffer draws the demand's
energy plus its losses plus what is left stored at the end; the limiter's deferred work is counted as spent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dtpo.telemetry.power_swing import joules_text, watts_text

DEFAULT_FLOOR_SHARE = 0.5
DEFAULT_LIMITER = {"floor_share": 0.3, "ramp_up_share_per_s": 0.5, "ramp_down_share_per_s": 0.5,
                   "hysteresis_s": 0.1}
DEFAULT_ROUND_TRIP = 0.9  # round-trip efficiency of the buffer (an assumption, stated with the result)
DEFAULT_BUFFER_STEPS = 2.0  # buffer capacity: this many steps of the measured swing
DEFAULT_FILL_SHARE = 0.8  # gaps filled up to this share of the compute-phase power


@dataclass(frozen=True)
class WhatIf:
    """A mitigation applied to a timeline.

    Attributes:
        name: Its name (``power floor``, ...).
        settings: Its settings, in words.
        watts: The power the grid would see, on the input's grid.
        energy_cost_j: Joules beyond the measured timeline's (dummy work, losses, energy left in a store).
        measured_j: The measured timeline's joules (what the cost is a share of).
        delay_s: Time the work is delayed by (the ramp limiter's deferred work at the end, at the last level).
        note: What else the figure rests on.
    """

    name: str
    settings: str
    watts: np.ndarray
    energy_cost_j: float
    measured_j: float
    delay_s: float = 0.0
    note: str = ""

    @property
    def energy_cost_share(self) -> float:
        """The cost as a share of the measured energy."""
        return self.energy_cost_j / self.measured_j if self.measured_j > 0 else 0.0


def power_floor(watts: np.ndarray, dt_s: float, limit_w: float, share: float = DEFAULT_FLOOR_SHARE) -> WhatIf:
    """Power never below ``share`` of ``limit_w``: the difference is burnt."""
    w = np.asarray(watts, dtype=float)
    out = np.maximum(w, share * limit_w)
    return WhatIf("power floor", f"{100 * share:.0f} % of the limit ({watts_text(share * limit_w)})", out,
                  float((out - w).sum() * dt_s), float(w.sum() * dt_s))


@dataclass(frozen=True)
class LimiterTrace:
    """What the ramp limiter did, sample by sample.

    Attributes:
        served_w: Power of the real work served (the demand, minus what was deferred, plus deferred work caught up).
        output_w: Power drawn: the served work plus dummy work.
        backlog_j: Deferred work not yet served, after each sample.
    """

    served_w: np.ndarray
    output_w: np.ndarray
    backlog_j: np.ndarray


def limit_ramps(watts: np.ndarray, dt_s: float, floor_w: float, ramp_up_w_per_s: float, ramp_down_w_per_s: float,
                hysteresis_s: float, ceiling_w: float = math.inf) -> LimiterTrace:
    """Run the GB200-like limiter over a timeline (see :func:`ramp_limiter`); deferred work is caught up at no
    more than ``ceiling_w``."""
    w = np.asarray(watts, dtype=float)
    served = np.empty_like(w)
    output = np.empty_like(w)
    backlog = np.empty_like(w)
    level = max(float(w[0]), floor_w)
    owed = 0.0
    below_s = 0.0
    up, down = ramp_up_w_per_s * dt_s, ramp_down_w_per_s * dt_s
    for i, demand in enumerate(w):
        wanted = demand + owed / dt_s
        serve = min(wanted, level + up, max(ceiling_w, demand))
        owed += (demand - serve) * dt_s
        if serve >= level:
            below_s = 0.0
            envelope = serve
        else:
            below_s += dt_s
            envelope = level if below_s <= hysteresis_s + 1e-12 else level - down
        level = max(serve, envelope, floor_w)
        served[i], output[i], backlog[i] = serve, level, owed
    return LimiterTrace(served, output, backlog)


def ramp_limiter(watts: np.ndarray, dt_s: float, limit_w: float, floor_share: float = DEFAULT_LIMITER["floor_share"],
                 ramp_up_share_per_s: float = DEFAULT_LIMITER["ramp_up_share_per_s"],
                 ramp_down_share_per_s: float = DEFAULT_LIMITER["ramp_down_share_per_s"],
                 hysteresis_s: float = DEFAULT_LIMITER["hysteresis_s"]) -> WhatIf:
    """GB200-like power smoothing: a floor, limited ramps up and down, and a hold before falling.

    Rates are shares of ``limit_w`` per second. Work the ramp-up limit holds back is served later (energy kept), at
    no more than the highest power the work itself drew (running faster would need a higher clock than the
    trace's); whatever is still owed at the end is counted as spent and reported as a delay at the last level.
    """
    w = np.asarray(watts, dtype=float)
    trace = limit_ramps(w, dt_s, floor_share * limit_w, ramp_up_share_per_s * limit_w,
                        ramp_down_share_per_s * limit_w, hysteresis_s, ceiling_w=float(w.max()))
    owed = float(trace.backlog_j[-1])
    owed = owed if owed > 1e-9 * float(np.abs(w).sum() * dt_s) else 0.0  # rounding, not work
    dummy = float((trace.output_w - trace.served_w).sum() * dt_s)
    last = float(trace.output_w[-1])
    settings = (f"floor {100 * floor_share:.0f} %, up {100 * ramp_up_share_per_s:.0f} %/s, down "
                f"{100 * ramp_down_share_per_s:.0f} %/s of the limit, hold {hysteresis_s:g} s")
    most = float(trace.backlog_j.max())
    note = f"work deferred by the ramp-up limit: up to {joules_text(most)}" if most > 0 else ""
    return WhatIf("ramp limiter (GB200-like)", settings, trace.output_w, dummy, float(w.sum() * dt_s),
                  delay_s=owed / last if last > 0 else 0.0, note=note)


@dataclass(frozen=True)
class BufferTrace:
    """What the energy buffer did, sample by sample.

    Attributes:
        grid_w: Power drawn from the grid.
        stored_j: Energy in the store after each sample.
        loss_j: Energy lost in the store over the timeline.
    """

    grid_w: np.ndarray
    stored_j: np.ndarray
    loss_j: float


def run_buffer(watts: np.ndarray, dt_s: float, capacity_j: float, round_trip: float = DEFAULT_ROUND_TRIP,
               tau_s: float = 10.0) -> BufferTrace:
    """Run an energy store of ``capacity_j`` (starting half full) between the grid and a demand ``watts``.

    The grid is asked for an exponential mean of the demand over ``tau_s`` plus a pull towards a half-full store
    (over ``4 tau_s``); the store covers the difference as far as its charge and room allow. Charging and
    discharging each lose ``1 - sqrt(round_trip)`` of what passes.
    """
    w = np.asarray(watts, dtype=float)
    eff = math.sqrt(round_trip)
    grid = np.empty_like(w)
    stored = np.empty_like(w)
    charge = capacity_j / 2
    warm = max(1, min(w.size, int(round(tau_s / dt_s))))
    mean = float(w[:warm].mean())
    alpha = min(1.0, dt_s / tau_s)
    loss = 0.0
    for i, demand in enumerate(w):
        mean += alpha * (demand - mean)
        target = mean + (capacity_j / 2 - charge) / (4 * tau_s)
        give = demand - target  # > 0: the store discharges
        if give > 0:
            give = min(give, charge * eff / dt_s)
            charge -= give * dt_s / eff
            loss += give * dt_s * (1 / eff - 1)
        else:
            take = min(-give, (capacity_j - charge) / (eff * dt_s))
            charge += take * dt_s * eff
            loss += take * dt_s * (1 - eff)
            give = -take
        grid[i] = demand - give
        stored[i] = charge
    return BufferTrace(grid, stored, loss)


def energy_buffer(watts: np.ndarray, dt_s: float, capacity_j: float, round_trip: float = DEFAULT_ROUND_TRIP,
                  tau_s: float = 10.0) -> WhatIf:
    """GB300-like energy storage: the grid draws a smoothed power, the store of ``capacity_j`` the rest."""
    w = np.asarray(watts, dtype=float)
    trace = run_buffer(w, dt_s, capacity_j, round_trip, tau_s)
    kept = float(trace.stored_j[-1] - capacity_j / 2)
    return WhatIf("energy buffer (GB300-like)",
                  f"{joules_text(capacity_j)}, round trip {100 * round_trip:.0f} % (assumed), smoothing over "
                  f"{tau_s:.3g} s", trace.grid_w, float((trace.grid_w - w).sum() * dt_s), float(w.sum() * dt_s),
                  note=f"losses {joules_text(trace.loss_j)}; {'+' if kept >= 0 else '-'}{joules_text(abs(kept))} "
                       "left in the store at the end")


def gap_mask(t_s: np.ndarray, gaps: Sequence[tuple[float, float]]) -> np.ndarray:
    """True at grid times inside any ``(start, end)`` gap."""
    t = np.asarray(t_s, dtype=float)
    mask = np.zeros(t.size, dtype=bool)
    if not gaps:
        return mask
    starts = np.array([g[0] for g in gaps])
    ends = np.array([g[1] for g in gaps])
    order = np.argsort(starts)
    starts, ends = starts[order], ends[order]
    i = np.searchsorted(starts, t, side="right") - 1
    inside = i >= 0
    mask[inside] = t[inside] < ends[i[inside]]
    return mask


def fill_gaps(watts: np.ndarray, t_s: np.ndarray, dt_s: float, gaps: Sequence[tuple[float, float]],
              share: float = DEFAULT_FILL_SHARE) -> WhatIf | None:
    """Dummy work in the communication gaps, up to ``share`` of the compute-phase power (the mean outside the
    gaps); ``None`` when the step marks give no gaps on this timeline."""
    w = np.asarray(watts, dtype=float)
    mask = gap_mask(t_s, gaps)
    if not mask.any() or mask.all():
        return None
    level = share * float(w[~mask].mean())
    out = np.where(mask, np.maximum(w, level), w)
    return WhatIf("fill communication gaps", f"up to {100 * share:.0f} % of the compute-phase power "
                  f"({watts_text(level)}) in {len(gaps):,} gaps", out, float((out - w).sum() * dt_s),
                  float(w.sum() * dt_s),
                  note=f"{100 * mask.mean():.0f} % of the time is in a gap")
