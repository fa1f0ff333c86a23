"""The power tuner: an explicit state machine that finds the GPU setting a cost metric prefers, while training.

States (:class:`Phase`): ``wait`` (the first steps, not representative), ``warmup`` (after a change, until the
GPU has settled), ``profile`` (measuring a setting), ``hold`` (the choice is in force; its cost is watched and
a lasting drift starts the search again). Deciding what to measure next happens between two blocks and takes
no steps of its own.

It is fed *blocks*: a few consecutive steps with their time, samples and energy over all GPUs
(:meth:`PowerTuner.feed`), and answers with the setting that must be in force for the next block. The caller
applies it (through the journaled knob controller on real GPUs, or on simulated ones) and asks
:attr:`PowerTuner.block_steps` how many steps the next block should have. The same code runs on real and
simulated GPUs.

The search, over one knob's candidate settings ordered from the default (maximum power limit or clocks
floating) downwards:

1. Measure the default first (it is in force anyway): it is the reference for ``MaxSlowdown`` and for what
   profiling costs.
2. Visit the setting a physical model predicts to be best (:mod:`dtpo.tune.prior`), then the unvisited
   neighbours of whichever setting is best so far, outwards. A first visit is short
   (``first_visit_steps``); the interval of each estimate comes from the per-step noise pooled over all
   settings (:mod:`dtpo.tune.stats`).
3. A setting whose cost is above the best by more than ``z`` standard errors of the difference is dropped
   and never visited again; so is one that a ``MaxSlowdown`` constraint rules out. Once a setting is
   clearly worse than the best by ``steep_rise`` *and* clearly slower than its higher neighbour (the limit
   bites hard there), every lower setting is dropped unvisited: time only grows as the limit falls, and
   power cannot fall fast enough to pay for it. This is what saves a full sweep's steps at the lowest limits.
4. When every remaining setting has been visited, the survivors race until the best is within ``tolerance``
   of every survivor even at the pessimistic ends of their intervals, or the profiling budget
   (``budget_steps_per_candidate`` times the number of candidates, warm-ups included, a hard cap) is spent.
   Every challenger still in the running first gets a fair look of its own (``first_visit_steps +
   revisit_steps``), so a setting misjudged on a short first visit is not left behind; then the rest of the
   budget is shared out by OCBA (:mod:`dtpo.tune.allocation`), which gives close challengers and the best
   the steps that decide between them. Under ``MaxSlowdown``, while the best or a cheaper setting may be too
   slow, its time and the default's are measured instead, each step going where it narrows their comparison
   most for what it costs. Then the best estimate is held.
5. Under ``MaxSlowdown``, on a knob that can name settings between its candidates, the race first moves the
   choice up to the allowed slowdown with a setting placed between two candidates (:mod:`dtpo.tune.boundary`),
   and when the search ends the choice moves on to the setting between it and the next setting down where
   their chord reaches the bound less its margin. Such an interpolated choice is measured while it is held; if
   its own steps show it clearly too slow, the setting above it is held instead.
6. For the other metrics, where the race left another setting not clearly costlier than the choice (a near-tie
   the budget could not settle), the held choice and that runner-up are trained at in turn, a hold block each,
   until one is clearly cheaper or ``refine_steps`` have passed; the cheaper is then held
   (:mod:`dtpo.tune.hold_refine`).

Who decides what: this module is the state machine (the phases, visits, warm-ups, the budget's hard cap, drift).
What to measure next and when to stop is its *search policy*'s, chosen once from the metric
(:func:`dtpo.tune.policy.search_policy`): the plain race of steps 2-4 (:mod:`dtpo.tune.race`), or, for
``MaxSlowdown``, that race with the bound's moves of steps 3-5 (:mod:`dtpo.tune.bound_search`). What happens to the
choice while it is held is its *hold policy*'s (step 6, :mod:`dtpo.tune.hold_refine`). Each works on what the
tuner hands it (the candidates, a judgement of their figures, what is left of the budget) and answers with a
decision the tuner carries out.

Warm-up after a change is sized from the settling observed so far: after each change the blocks of the
visit are compared with the visit's settled level, the time until they stay within the noise is that
change's settling time, and later warm-ups last the largest settling seen (times 1.2) in steps, at least
``min_warmup_steps``. Blocks measured before a visit turned out to be settled are moved out of its figures.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

from dtpo.tune.boundary import pool_with_chords
from dtpo.tune.cost import CostContext, CostMetric
from dtpo.tune.knob import Knob, candidate_grid
from dtpo.tune.policy import hold_policy, search_policy
from dtpo.tune.race import Guess
from dtpo.tune.report import profiling_cost, projected_saving, settings_rows, unprofiled_rows
from dtpo.tune.setting import GpuSetting, Segment
from dtpo.tune.settling import SettlingWatch
from dtpo.tune.stats import Block, Estimate, NoiseEstimate, SettingStats, estimate, t_quantile
from dtpo.tune.tuner_types import Candidate, Judgement, Next, Phase, Placement, Room, TunerOptions, Visit

__all__ = ["Candidate", "Phase", "PowerTuner", "TunerOptions"]

logger = logging.getLogger(__name__)


class PowerTuner:
    """Finds and holds the setting with the least cost; see the module docs.

    Args:
        dimensions: The knobs to tune, in order: each a :class:`~dtpo.tune.knob.Knob` (or a bare function) from
            the setting chosen so far (the default for the first) to that knob's candidate settings, the first
            of which is the setting chosen so far itself. Two dimensions tune e.g. the SM clock, then the power
            limit at that clock.
        metric: What to minimise.
        context: GPUs and maximum power for the metric.
        options: Search parameters.
        default: The setting in force before tuning.
        guess: Optional model: given the candidates and the default's measured estimate, the index of the
            candidate predicted to be best (see :mod:`dtpo.tune.prior`).
    """

    def __init__(self, dimensions: Sequence[Callable[[GpuSetting], list[GpuSetting]] | Knob], metric: CostMetric,
                 context: CostContext, default: GpuSetting, options: TunerOptions | None = None,
                 guess: Guess | None = None) -> None:
        if not dimensions:
            raise ValueError("a tuner needs at least one knob")
        self.dimensions = [d.candidates if isinstance(d, Knob) else d for d in dimensions]
        self.betweens = [d.between if isinstance(d, Knob) else None for d in dimensions]
        self.dimension_names = [d.name if isinstance(d, Knob) else f"knob {i + 1}" for i, d in enumerate(dimensions)]
        self.metric = metric
        self.context = context
        self.options = options or TunerOptions()
        self.default = default
        self.guess = guess
        self.search = search_policy(metric, self.options, guess)  # what to measure next, and when to stop
        self.search.start_knob(self.betweens[0])
        self.hold = hold_policy(self.options, self.search)  # what happens to the choice while it is held
        self.phase = Phase.WAIT
        self.current = default
        self.choice: GpuSetting | None = None
        self.stats: dict[GpuSetting, SettingStats] = {}
        self.segments: list[Segment] = []
        self.settling = SettlingWatch(self.options.settling_z, self.options.settling_min_spread,
                                      self.options.warmup_settling_factor)
        self.profiling_steps = 0  # steps from the start until the choice was held
        self.steps = 0
        self.retunes = 0
        self.steps_back = 0  # interpolated choices given up while held (too slow)
        self.history: list[str] = []
        self._dimension = 0
        self._candidates: list[Candidate] = []
        self._visit: Visit | None = None
        self._wait_left = self.options.wait_steps
        self._waited_s = 0.0
        self._last_step_s = 0.0
        self._reference: SettingStats | None = None  # the default's figures, for MaxSlowdown
        self._budget = 0
        self._spent = 0
        self._drift_strikes = 0

    @property
    def refined(self) -> dict[str, Any] | None:
        """What settling a near-tie while holding did (:mod:`dtpo.tune.hold_refine`); ``None`` when nothing was."""
        return self.hold.refined

    # -- what the caller asks ------------------------------------------------------------------------------

    @property
    def block_steps(self) -> int:
        """Steps the next block should have."""
        if self.phase is Phase.HOLD:
            return self.options.drift_window_steps
        if self.phase is Phase.WAIT:
            short_s = self.options.min_wait_s - self._waited_s
            by_time = math.ceil(short_s / self._last_step_s) if short_s > 0 and self._last_step_s > 0 else 0
            return max(self._wait_left, by_time, 1)
        if self.options.min_block_s > 0 and self._last_step_s > 0:
            return max(1, math.ceil(self.options.min_block_s / self._last_step_s))
        return 1

    @property
    def settling_s(self) -> list[float]:
        """One settling time per change observed so far (see :mod:`dtpo.tune.settling`)."""
        return self.settling.seconds

    @property
    def current_knob(self) -> str | None:
        """The knob being searched now (``None`` while waiting or holding)."""
        if self.phase in (Phase.WAIT, Phase.HOLD) or self._dimension >= len(self.dimension_names):
            return None
        return self.dimension_names[self._dimension]

    @property
    def holding(self) -> bool:
        """True once a choice is in force."""
        return self.phase is Phase.HOLD

    def start_from_profile(self, measured: dict[GpuSetting, SettingStats], held: Any = None) -> GpuSetting:
        """Hold the best setting of a saved profile at once (no profiling).

        Args:
            measured: The profile's settings and figures.
            held: The setting a checkpointed search was holding: held again as it is (a search's choice is not
                always the cheapest of its figures: it may have rejected or dropped a setting that looks cheaper).
        """
        self.stats.update(measured)
        default_stats = measured.get(self.default)
        self._reference = default_stats
        if held is not None and held in measured:
            self._hold(held, "checkpoint")
            return held
        estimates = self._estimates(list(measured.values()))
        best = self._best(estimates).setting
        if len(self.dimensions) == 1 and self.search.can_interpolate:  # as a search ends (interpolate_choice)
            ordered = sorted(measured.values(), key=lambda st: st.setting.sort_key, reverse=True)
            self._candidates = [Candidate(i, st, "measured") for i, st in enumerate(ordered)]
            chosen = self._interpolated(next(c for c in self._candidates if c.stats.setting == best))
            chosen.status = "chosen"
            best = chosen.stats.setting
        self._hold(best, "saved profile")
        return best

    def reject(self, setting: Any, reason: str) -> Any:
        """Rule ``setting`` out for good (a convergence guard refused it) and decide again; returns the setting
        for the next block. A rejected setting is never visited again, and its measured figures, if any, no
        longer count toward the choice. Rejecting the setting chosen so far (the first candidate) is refused:
        it is the reference every other candidate is judged against."""
        candidate = next((c for c in self._candidates if c.stats.setting == setting), None)
        if candidate is None or self.phase in (Phase.WAIT, Phase.HOLD):
            raise ValueError(f"{getattr(setting, 'label', setting)} is not a candidate of the current search")
        if candidate.index == 0:
            raise ValueError("the setting the search started from cannot be rejected")
        candidate.status, candidate.reason = "rejected", reason
        self.history.append(f"rejected {setting.label}: {reason}")
        if self._visit is not None and self._visit.candidate is candidate:
            self._visit = None
            self._decide()
        return self.current

    # -- the state machine ----------------------------------------------------------------------------------

    def feed(self, block: Block) -> GpuSetting:
        """Account one block measured at :attr:`current`; returns the setting for the next block."""
        if block.steps <= 0:
            return self.current
        self.steps += block.steps
        if block.time_s > 0:
            self._last_step_s = block.time_s / block.steps
        if self.phase is Phase.WAIT:
            self._record(block, "wait")
            self._wait_left -= block.steps
            self._waited_s += block.time_s
            if self._wait_left <= 0 and self._waited_s >= self.options.min_wait_s:
                self._start_dimension()
            return self.current
        if self.phase is Phase.HOLD:
            self._record(block, "hold")
            if self.hold.active:  # a lasting drift ends the refining with a new search
                self._watch_drift(block)
                if self.hold.active:
                    step = self.hold.feed(block, self.current, self._judgement)
                    if step.note is not None:
                        self.history.append(step.note)
                    if step.settled:
                        self.choice = step.setting
                    self.current = step.setting
                return self.current
            if self._check_held(block):
                return self.current
            self._watch_drift(block)
            return self.current
        visit = self._visit
        assert visit is not None
        self._spent += block.steps
        visit.elapsed_s += block.time_s
        visit.blocks.append((visit.elapsed_s - block.time_s, block))
        if visit.warmup_left > 0:
            self._record(block, "warmup")
            visit.warmup_left -= block.steps
            visit.candidate.stats.warmup_steps += block.steps
            if visit.warmup_left <= 0:
                self.phase = Phase.PROFILE
            return self.current
        self._record(block, "profile")
        visit.candidate.stats.blocks.append(block)
        if (visit.candidate.stats.steps >= visit.target_steps or self._spent >= self._budget
                or self._already_clearly_worse(visit)):
            self._end_visit()
        return self.current

    def _already_clearly_worse(self, visit: Visit) -> bool:
        """A first visit ends after ``quick_look_steps`` when the setting is already clearly costlier than the
        best measured so far: the steps go to the settings still in the running."""
        stats = visit.candidate.stats
        if visit.candidate.status != "measured" or stats.steps < self.options.quick_look_steps \
                or stats.steps >= self.options.first_visit_steps or len(stats.blocks) < 1:
            return False
        others = [c.stats for c in self._candidates if c.status == "measured" and c is not visit.candidate
                  and c.stats.steps >= self.options.first_visit_steps]
        if not others or not self.search.quick_looks:
            return False
        noise = self._noise()
        best = min((estimate(o, noise, self.metric, self.context) for o in others), key=lambda e: e.cost)
        mine = estimate(stats, noise, self.metric, self.context)
        z = t_quantile(noise.dof, self.options.z)
        return mine.cost - best.cost > z * math.hypot(mine.cost_se, best.cost_se)

    def _record(self, block: Block, phase: str) -> None:
        last = self.segments[-1] if self.segments else None
        if last is not None and last.setting == self.current and last.phase == phase:
            self.segments[-1] = Segment(self.current, phase, last.steps + block.steps, last.samples + block.samples,
                                        last.time_s + block.time_s, last.energy_j + block.energy_j)
        else:
            self.segments.append(Segment(self.current, phase, block.steps, block.samples, block.time_s,
                                         block.energy_j))

    def _stats_of(self, setting: GpuSetting) -> SettingStats:
        stats = self.stats.get(setting)
        if stats is None:
            stats = self.stats[setting] = SettingStats(setting)
        return stats

    def _start_dimension(self) -> None:
        base = self.choice if self._dimension > 0 and self.choice is not None else self.default
        settings = self.dimensions[self._dimension](base)
        if not settings or settings[0] != base:
            raise ValueError("a knob's candidates must start with the setting chosen so far")
        self._candidates = [Candidate(i, self._stats_of(s)) for i, s in enumerate(settings)]
        for c in self._candidates:
            if c.stats.measured:
                c.status = "measured"
        self._budget = self._spent + self.options.budget_steps_per_candidate * len(settings)
        self.search.start_knob(self.betweens[self._dimension])
        self.choice = None
        first = self._candidates[0]
        target = first.stats.steps + self.options.first_visit_steps
        self._begin_visit(first, target, changed=first.stats.setting != self.current)

    def _begin_visit(self, candidate: Candidate, target_steps: int, changed: bool) -> None:
        warmup = 0
        if changed:
            warmup = self._warmup_steps()
        self._visit = Visit(candidate, target_steps, warmup, changed)
        if candidate.status == "unvisited":
            candidate.status = "measured"
        self.current = candidate.stats.setting
        self.phase = Phase.WARMUP if warmup > 0 else Phase.PROFILE

    def _warmup_steps(self) -> int:
        settle = self.settling.warmup_s(self.options.min_warmup_s, self.options.max_warmup_s)
        step_s = self._step_time_s() or self._last_step_s
        steps = math.ceil(settle / step_s) if step_s > 0 else 0
        return max(self.options.min_warmup_steps, steps)

    def _step_time_s(self) -> float:
        measured = [s for s in self.stats.values() if s.steps]
        steps = sum(s.steps for s in measured)
        return sum(s.time_s for s in measured) / steps if steps else 0.0

    # -- settling ---------------------------------------------------------------------------------------------

    def _end_visit(self) -> None:
        visit = self._visit
        assert visit is not None
        if visit.started_by_change:
            self._observe_settling(visit)
        self._visit = None
        self._decide()

    def _observe_settling(self, visit: Visit) -> None:
        """How long after the change this visit's blocks reached their settled level; move the earlier blocks
        out of the setting's figures."""
        settled_from = self.settling.observe(visit.blocks, visit.elapsed_s, self._noise().cost_cv)
        unsettled = {id(b) for _, b in visit.blocks[:settled_from]}
        if unsettled:
            stats = visit.candidate.stats
            moved = [b for b in stats.blocks if id(b) in unsettled]
            stats.blocks = [b for b in stats.blocks if id(b) not in unsettled]
            stats.warmup_steps += sum(b.steps for b in moved)
            logger.debug("tuner: %s settled after %.2f s", stats.setting.label, self.settling.seconds[-1])

    # -- deciding ---------------------------------------------------------------------------------------------

    def _noise(self) -> NoiseEstimate:
        return NoiseEstimate.pooled([s for s in self.stats.values() if s.measured], self.metric, self.context,
                                    self.options.noise_prior_cv, self.options.noise_prior_steps)

    def _estimates(self, stats: list[SettingStats]) -> list[Estimate]:
        noise = self._noise()
        return [estimate(s, noise, self.metric, self.context) for s in stats if s.measured]

    def _best(self, estimates: list[Estimate]) -> Estimate:
        """The cheapest allowed estimate; as in a search, a setting off the knobs' candidates (placed towards a
        ``MaxSlowdown`` bound) must be allowed with a margin (its own figures only: no chord, so a saved profile
        errs towards the grid setting above it), and so must a candidate where the choice can be interpolated."""
        ref = self._reference_estimate()
        z = t_quantile(self._noise().dof, self.options.z)
        grid = set(candidate_grid(self.dimensions, self.default))
        feasible = [e for e in estimates
                    if self.search.allowed(e, ref, self.search.choice_margin(e.setting not in grid, z))]
        return min(feasible or estimates, key=lambda e: e.cost)

    def _reference_estimate(self) -> Estimate | None:
        """The default setting's figures (what ``MaxSlowdown`` compares with)."""
        if self._reference is None or not self._reference.measured:
            return None
        return estimate(self._reference, self._noise(), self.metric, self.context)

    def _decide(self) -> None:
        """Between two blocks, after a visit: the search policy judges every measured setting again and says what
        to do next (visit a candidate, place a new one and visit it, or end the search); carry it out."""
        if self._reference is None and self._dimension == 0:
            self._reference = self._candidates[0].stats
        room = Room(self._budget - self._spent, self._warmup_steps(), self.current)
        self._carry_out(self.search.decide(self._candidates, self._judgement(), room))

    def _carry_out(self, step: Next) -> None:
        if step.ends:
            self._finish_dimension(step.best, step.why)
            return
        pick = self._insert(step.placed) if step.placed is not None else step.visit
        assert pick is not None
        self._revisit(pick, step.steps, step.best)

    def _judgement(self) -> Judgement:
        """Every measured candidate's estimate (a placed setting's pooled with its chord), the default's, how many
        standard errors make a difference clear, and the pooled noise of a step's time."""
        measured = [c for c in self._candidates if c.stats.measured]
        noise = self._noise()
        j = Judgement(estimates=dict(zip((c.index for c in measured),
                                          self._estimates([c.stats for c in measured]), strict=True)),
                      ref=self._reference_estimate(), z=t_quantile(noise.dof, self.options.z),
                      reference=next((c for c in self._candidates if c.stats is self._reference), None),
                      time_cv=noise.time_cv)
        pool_with_chords(measured, j.estimates)  # a placed setting's figures count its neighbours' chord
        return j

    def _insert(self, placed: Placement) -> Candidate:
        """A new candidate for a setting a search policy placed, in its place right below ``placed.chord.fast``."""
        new = Candidate(placed.chord.fast.index + 1, self._stats_of(placed.setting), chord=placed.chord,
                        reason=placed.reason)
        self._candidates.insert(new.index, new)
        for i, c in enumerate(self._candidates):
            c.index = i
        self.history.append(f"{placed.setting.label}: {placed.reason}")
        return new

    def _revisit(self, pick: Candidate, steps: int, best: Candidate) -> None:
        """Visit ``pick`` for ``steps`` more measured steps, fewer where the budget is short; where what is left of
        the budget would not even cover the warm-up and one measured step, hold ``best`` instead: the budget is a
        hard cap on profiling, warm-ups included."""
        changed = pick.stats.setting != self.current
        left = self._budget - self._spent - (self._warmup_steps() if changed else 0)
        if left < 1:
            self._finish_dimension(best, "profiling budget spent")
            return
        self._begin_visit(pick, pick.stats.steps + min(steps, left), changed=changed)

    def _interpolated(self, best: Candidate) -> Candidate:
        """The candidate to hold where a search ends on ``best``: a new one between ``best`` and a neighbour where
        the search policy moves the choice so (``MaxSlowdown``: towards the bound), else ``best``."""
        if not self.search.can_interpolate:
            return best
        placed = self.search.interpolate(self._candidates, best, self._judgement())
        return best if placed is None else self._insert(placed)

    def _finish_dimension(self, best: Candidate, why: str) -> None:
        best = self._interpolated(best)
        self.choice = best.stats.setting
        best.status = "chosen"
        self.history.append(f"{self.dimension_names[self._dimension]}: {best.stats.setting.label} ({why})")
        self._dimension += 1
        if self._dimension < len(self.dimensions):
            self._start_dimension()
            return
        self._hold(best.stats.setting, why)
        note = self.hold.start(best, self._candidates, self._judgement)
        if note is not None:
            self.history.append(note)

    def _hold(self, setting: GpuSetting, why: str, searched: bool = True) -> None:
        """Hold ``setting``; ``searched``: it ends a search (the steps so far were profiling), not a step back from
        a held choice that proved too slow while training at it."""
        self.choice = setting
        self.current = setting
        self.phase = Phase.HOLD
        if searched:
            self.profiling_steps = self.steps
        self._drift_strikes = 0
        logger.debug("tuner: holding %s (%s) after %d steps", setting.label, why, self.steps)

    # -- holding ------------------------------------------------------------------------------------------------

    def _check_held(self, block: Block) -> bool:
        """A held choice the search policy still checks (an interpolated ``MaxSlowdown`` choice, with no profiling
        steps of its own) is measured by the hold blocks; once the policy rules it out, the setting above it is held
        instead. Returns whether the block went to that check."""
        held = self.search.held_to_check(self._candidates, self.current)
        if held is None:
            return False
        held.stats.blocks.append(block)
        above = self.search.step_back(held, self._judgement())
        if above is not None:
            self.history.append(f"{held.stats.setting.label}: too slow while held; back to {above.stats.setting.label}")
            logger.info("tuner: %s proved too slow while held; holding %s", held.stats.setting.label,
                        above.stats.setting.label)
            self.steps_back += 1
            self._hold(above.stats.setting, "the interpolated choice proved too slow", searched=False)
        return True
    def _watch_drift(self, block: Block) -> None:
        stats = self.stats.get(self.current)
        if stats is None or not stats.measured or block.samples <= 0:
            return
        a, b = self.metric.weights(self.context)
        cost = (a * block.time_s + b * block.energy_j) / block.samples
        expected = stats.cost(self.metric, self.context)
        if expected > 0 and abs(cost / expected - 1.0) > self.options.drift:
            self._drift_strikes += 1
        else:
            self._drift_strikes = 0
        if self._drift_strikes >= 2:
            self.retunes += 1
            logger.info("tuner: the cost of %s drifted by %+.0f %%; searching again", self.current.label,
                        (cost / expected - 1.0) * 100)
            self.history.append(f"drift at step {self.steps}: search again")
            self.hold.stop()
            self.stats.clear()
            self._reference = None
            self._dimension = 0
            self.choice = None
            self._wait_left = 0
            self._start_dimension()  # back to the default, warmed up like any change

    # -- results ----------------------------------------------------------------------------------------------

    def candidates(self) -> list[Candidate]:
        """The current knob's candidates with their status."""
        return list(self._candidates)

    def _default_stats(self) -> SettingStats | None:
        return self._reference if self._reference is not None else self.stats.get(self.default)

    def profiling_cost(self) -> dict[str, float] | None:
        """Extra time and energy the steps before holding cost against the default (see :mod:`dtpo.tune.report`)."""
        return profiling_cost(self.segments, self._default_stats())

    def projected_saving(self, remaining_samples: int) -> dict[str, float] | None:
        """What holding the choice instead of the default saves over ``remaining_samples`` (estimates)."""
        chosen = self.stats.get(self.choice) if self.choice is not None else None
        return projected_saving(self._default_stats(), chosen, self.metric, self.context, remaining_samples)

    def report(self, remaining_samples: int | None = None) -> dict[str, Any]:
        """What was tried, what it cost, and the choice: plain values for the record.

        Args:
            remaining_samples: Samples the job trains after the choice was held, for the projected saving.
        """
        noise = self._noise()
        status = {c.stats.setting: (c.status, c.reason) for c in self._candidates}
        rows = settings_rows(self.stats.values(), status, noise, self.metric, self.context, self.options.z)
        unprofiled = []
        if any(c.chord is not None and not c.stats.measured for c in self._candidates):
            unprofiled = unprofiled_rows(self._candidates, self._judgement().estimates, self.options.z)
        if unprofiled:  # in their place, from the most power allowed down
            rows = sorted(rows + unprofiled, key=lambda r: GpuSetting.from_dict(r).sort_key, reverse=True)
        return {"metric": self.metric.name, "metric_description": self.metric.describe(),
                "unit": self.metric.unit, "phase": self.phase.value,
                "choice": None if self.choice is None else self.choice.as_dict(),
                "profiling_steps": self.profiling_steps, "steps": self.steps, "retunes": self.retunes,
                "steps_back": self.steps_back, "refined": self.refined,
                "settling_s": max(self.settling_s, default=None), "noise_cv": noise.cost_cv,
                "settings": rows, "history": list(self.history), "default": self.default.as_dict(),
                "profiling_cost": self.profiling_cost(),
                "projected_saving": None if remaining_samples is None else self.projected_saving(remaining_samples),
                "segments": [seg.as_dict() for seg in self.segments]}
