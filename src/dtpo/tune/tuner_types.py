"""What the power tuner's state machine (:mod:`dtpo.tune.tuner`) and its policies work with: its phases, its search
options, the candidate settings with their status, a decision's judgement, what a search policy decides
(:class:`Next`) from what is left of the budget (:class:`Room`), and the current visit."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from dtpo.tune.setting import GpuSetting
from dtpo.tune.stats import PRIOR_CV, PRIOR_WEIGHT_STEPS, Block, Estimate, SettingStats

__all__ = ["Candidate", "Chord", "Judgement", "Next", "Phase", "Placement", "Refine", "Room", "TunerOptions", "Visit"]


class Phase(enum.Enum):
    """Where the tuner is."""

    WAIT = "wait"
    WARMUP = "warmup"
    PROFILE = "profile"
    HOLD = "hold"


@dataclass(frozen=True)
class TunerOptions:
    """How the tuner searches: every threshold, budget and weight of the power tuner and its policies is here, with
    the value it has always had as its default (``benchmarks/tuner_vs_zeus.py`` chooses some of them on one GPU's
    traces and judges them on another's). The physical prior's assumed memory-bound share
    (:data:`dtpo.tune.prior.ASSUMED_MEMORY_SHARE`) belongs to the model guess, which the caller builds.

    Attributes:
        wait_steps: Steps at the default before anything is measured (compilation, caches, data loaders).
        min_wait_s: The wait also lasts at least this long (a job's first second or two can run slower than
            the rest: allocator, caches, data-loader workers; short steps would end ``wait_steps`` within it).
        first_visit_steps: Measured steps of a setting's first visit.
        quick_look_steps: A first visit ends after this many steps when the setting is already clearly costlier
            than the best so far.
        revisit_steps: Measured steps added per visit while the survivors race.
        budget_steps_per_candidate: Profiling budget in steps (warm-ups included, a hard cap), per candidate
            setting. 16 keeps a search within a third of a Zeus sweep (50 steps per setting plus one).
        z: Standard errors of a difference that make a setting clearly worse (or clearly too slow).
        tolerance: Stop racing once the best is within this relative cost of every survivor.
        min_gap: Relative cost gap below which two contenders count as tied when the race shares out its steps
            (:func:`dtpo.tune.allocation.ocba_targets`).
        min_step_cost: The least relative cost a ``MaxSlowdown`` race charges for a step at any setting, when it
            weighs measuring a setting's time against measuring the default's
            (:func:`dtpo.tune.allocation.cheapest_information`).
        reference_weight: How many times a step at the default counts when a ``MaxSlowdown`` race weighs measuring
            an unsure setting's time against the default's. The default's time enters every verdict: the unsure
            setting's, the choice's, and a setting interpolated from them; an unlucky default estimate shifts
            them all at once (with equal weight, the race starves the default, and one default estimate two
            standard errors high let a choice 1.4 % past the bound through in ``benchmarks/tuner_vs_zeus.py``).
        steep_rise: Relative cost above the best that, with a clear slowdown, drops every lower setting.
        min_warmup_steps: Fewest warm-up steps after a change.
        min_warmup_s: Shortest warm-up in seconds (at least one update period of the energy counter, so the
            previous setting's energy, which a lagging counter reports late, falls into the warm-up).
        min_block_s: Shortest block in seconds while profiling (a few counter periods, so a block's energy is
            not mostly the counter's rounding).
        max_warmup_s: Longest warm-up, in seconds, whatever the settling estimate says.
        drift: Relative change of the held setting's cost that counts as drift (checked over
            ``drift_window_steps`` steps, twice in a row) and starts a new search.
        drift_window_steps: Steps per drift check while holding.
        ordered: Whether each knob's candidates lie along one axis on which time only grows (power limits,
            clocks): then steep rises prune the rest of the axis unvisited. Job knobs (precision, accumulation,
            compression) are not ordered that way.
        boundary_points: ``MaxSlowdown`` on an ordered knob that can name settings between its candidates: how
            many such settings a search may visit to move its choice up to the allowed slowdown
            (:mod:`dtpo.tune.boundary`); 0 keeps the search on the candidates.
        min_boundary_fraction: A setting between two candidates is visited only when it lies at least this
            share of the way from the allowed one to the next one down (closer, it saves too little to pay for
            its steps).
        interpolate_choice: ``MaxSlowdown`` on an ordered knob that can name settings between its candidates: when
            the search ends, hold the setting between its choice and the next setting down (measured, cheaper, not
            surely allowed) where the chord of their times reaches the bound less ``placed_z_share`` standard errors
            of that chord (:func:`dtpo.tune.boundary.interpolate_between`). A choice that a marginal verdict kept a
            whole candidate above the bound moves up to it instead, without profiling steps; the held setting is
            then measured while it trains and given up for the setting above it should it prove too slow.
        grid_z_share: Where the choice can be interpolated so (``interpolate_choice``), a candidate becomes the
            ``MaxSlowdown`` choice only once its time is below the bound by this share of ``z`` standard errors: a
            candidate near the bound whose estimate only just clears it is then interpolated towards instead of
            held on that estimate. Elsewhere a candidate is judged on its estimate alone (a margin would there
            cost a whole candidate's step).
        refine_steps: Once a search holds its choice, where another setting is not clearly costlier, train at
            the two in turn (a hold block each) for at most this many steps, then hold the cheaper
            (:mod:`dtpo.tune.hold_refine`); 0 holds the choice as the search left it.
        placed_z_share: A setting placed towards the ``MaxSlowdown`` bound becomes the choice once its time is
            below the bound by this share of ``z`` standard errors (and it is placed with that margin). A grid
            setting is judged on its estimate alone; a placed one sits near the bound by design, so it needs some
            margin, but the full ``z`` would keep it so far from the bound that it saves little. Half of ``z``
            (about one standard error) holds a setting past the bound about as often as Zeus's own 40-step
            comparison does (``benchmarks/tuner_vs_zeus.py``).
        noise_prior_cv: Relative spread of one step's cost (and time) assumed before anything is measured; the
            pooled noise is shrunk towards it while the evidence is thin (:meth:`dtpo.tune.stats.NoiseEstimate.pooled`).
        noise_prior_steps: How many steps' worth of evidence that assumed spread counts as.
        settling_z: Standard errors off a visit's settled level that make a block count as still settling
            (:class:`dtpo.tune.settling.SettlingWatch`).
        settling_min_spread: The least relative spread per step that settling is judged with.
        warmup_settling_factor: A warm-up lasts the longest settling seen times this (plus ``min_warmup_s``).
        far_too_slow: ``MaxSlowdown``: a setting measured this many times the bound (and clearly slower than the
            default, as is the one above it) drops every lower setting unvisited
            (:func:`dtpo.tune.boundary.rule_out_too_slow`).
        race_stay_share: While the race shares its steps out, the setting in force is measured again (no warm-up)
            when its step deficit is at least this share of the largest (:func:`dtpo.tune.race.stay_if_nearly`).
        time_stay_share: The same for a ``MaxSlowdown`` race measuring a setting's time against the default's.
        max_race_visit: A race visit measures at most this many times ``revisit_steps``.
    """

    wait_steps: int = 2
    min_wait_s: float = 0.0
    first_visit_steps: int = 4
    quick_look_steps: int = 2
    revisit_steps: int = 8
    budget_steps_per_candidate: int = 16
    z: float = 2.0
    tolerance: float = 0.01
    min_gap: float = 0.005
    min_step_cost: float = 0.1
    reference_weight: float = 2.0
    steep_rise: float = 0.25
    min_warmup_steps: int = 1
    min_warmup_s: float = 0.0
    min_block_s: float = 0.0
    max_warmup_s: float = 5.0
    drift: float = 0.10
    drift_window_steps: int = 200
    ordered: bool = True
    boundary_points: int = 1
    min_boundary_fraction: float = 0.1
    interpolate_choice: bool = True
    grid_z_share: float = 0.25
    placed_z_share: float = 0.5
    refine_steps: int = 2000
    noise_prior_cv: float = PRIOR_CV
    noise_prior_steps: int = PRIOR_WEIGHT_STEPS
    settling_z: float = 6.0
    settling_min_spread: float = 2e-3
    warmup_settling_factor: float = 1.2
    far_too_slow: float = 1.05
    race_stay_share: float = 0.5
    time_stay_share: float = 0.8
    max_race_visit: int = 2


@dataclass
class Candidate:
    """A setting the search may visit, with what is known about it."""

    index: int
    stats: SettingStats
    status: str = "unvisited"  # unvisited, measured, dropped (clearly worse), infeasible, pruned, rejected, chosen
    reason: str = ""
    chord: Chord | None = None  # placed between two candidates towards a MaxSlowdown bound (dtpo.tune.boundary)

    @property
    def interpolated(self) -> bool:
        """True for a setting placed between two candidates (see :mod:`dtpo.tune.boundary`)."""
        return self.chord is not None


@dataclass(frozen=True)
class Chord:
    """Where a placed setting lies: ``fraction`` of the way from candidate ``fast`` to candidate ``slow``."""

    fast: Candidate
    slow: Candidate
    fraction: float


@dataclass
class Judgement:
    """What one decision works from: every measured setting's estimate, the default's (``MaxSlowdown``'s
    reference), how many standard errors make a difference clear, and the pooled noise of a step's time."""

    estimates: dict[int, Estimate]
    ref: Estimate | None
    z: float
    reference: Candidate | None
    time_cv: float = 0.0  # relative spread of one step's time, pooled over the measured settings


@dataclass(frozen=True)
class Placement:
    """A setting between two candidates that a search policy wants as a new candidate, in its place right below
    ``chord.fast``; ``reason`` says why (for the history and the report)."""

    setting: GpuSetting
    chord: Chord
    reason: str


@dataclass(frozen=True)
class Room:
    """What a search policy is told about the search's state when it decides.

    Attributes:
        left: Profiling steps left in the budget (negative once overspent).
        warmup: Warm-up steps a change of setting costs now.
        current: The setting in force (staying there costs no warm-up).
    """

    left: int
    warmup: int
    current: GpuSetting


@dataclass(frozen=True)
class Next:
    """What a search policy decided after a visit: measure ``visit`` for ``steps`` more steps, or first insert
    ``placed`` as a new candidate and measure that; with neither, the search ends on ``best`` (``why``). ``best`` is
    what to hold should the budget not cover the visit."""

    best: Candidate
    visit: Candidate | None = None
    steps: int = 0
    placed: Placement | None = None
    why: str = ""

    @property
    def ends(self) -> bool:
        """True when the search ends on ``best``."""
        return self.visit is None and self.placed is None


@dataclass
class Refine:
    """A near-tie being settled while the tuner holds: its choice, the runner-up, and the steps left."""

    best: Candidate
    runner: Candidate
    left: int


@dataclass
class Visit:
    """The current stay at one candidate since it was applied."""

    candidate: Candidate
    target_steps: int
    warmup_left: int
    started_by_change: bool
    blocks: list[tuple[float, Block]] = field(default_factory=list)  # (seconds since the change, block)
    elapsed_s: float = 0.0
