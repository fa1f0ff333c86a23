"""How long a GPU takes to settle after a knob change, judged from the blocks measured after each change.

After a change the tuner measures a visit: warm-up blocks, then profile blocks. :class:`SettlingWatch` compares
each block's power in the first two thirds of the visit with the visit's settled level (the mean of its later
half); the last block that is off by more than six standard errors of that difference ends the settling, and
the time from the change to the next block is that change's settling time. The standard error comes from the
spread of settled blocks: the median absolute deviation of the later halves of all visits so far, robust to
the very overshoot being looked for. Later warm-ups last the longest settling seen (times 1.2). The three numbers
are the tuner's to set (``TunerOptions.settling_z``, ``settling_min_spread``, ``warmup_settling_factor``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dtpo.tune.stats import Block
from dtpo.tune.tuner_types import TunerOptions

# The defaults, set in TunerOptions (the one place the tuner's constants are): see its docs.
STANDARD_ERRORS = TunerOptions.settling_z
MIN_SPREAD = TunerOptions.settling_min_spread
WARMUP_FACTOR = TunerOptions.warmup_settling_factor


class SettlingWatch:
    """Settling times observed so far, and the spread of settled blocks they are judged against.

    Args:
        standard_errors: How many standard errors off the settled level a block must be to count as settling.
        min_spread: The least relative spread per step that blocks are judged with.
        warmup_factor: A warm-up lasts the longest settling seen times this.

    Attributes:
        seconds: One settling time per observed change.
    """

    def __init__(self, standard_errors: float = STANDARD_ERRORS, min_spread: float = MIN_SPREAD,
                 warmup_factor: float = WARMUP_FACTOR) -> None:
        self.seconds: list[float] = []
        self._deviations: list[float] = []
        self.standard_errors = standard_errors
        self.min_spread = min_spread
        self.warmup_factor = warmup_factor

    def warmup_s(self, extra_s: float, cap_s: float) -> float:
        """The warm-up a change needs: the longest settling seen times ``warmup_factor`` (1.2), plus ``extra_s``, at
        most ``cap_s``."""
        return min(max(self.seconds, default=0.0) * self.warmup_factor + extra_s, cap_s)

    def observe(self, timed: Sequence[tuple[float, Block]], elapsed_s: float, pooled_cv: float) -> int:
        """Judge one visit after a change: ``timed`` are its blocks with the seconds from the change to each.

        Args:
            timed: ``(seconds since the change, block)`` in order.
            elapsed_s: Seconds from the change to the end of the visit.
            pooled_cv: The tuner's pooled noise, used while too few settled blocks are in.

        Returns:
            How many of the first blocks were still settling (0 when the visit is too short to tell).
        """
        if len(timed) < 4:
            return 0
        half = timed[len(timed) // 2:]
        level = sum(b.energy_j for _, b in half) / sum(b.time_s for _, b in half)
        if level <= 0:
            return 0
        # deviations from the mean of the very blocks they come from are smaller by sqrt((n - 1) / n): undo it
        unshrink = math.sqrt(len(half) / (len(half) - 1))
        self._deviations += [abs(b.power_w / level - 1.0) * math.sqrt(max(b.steps, 1)) * unshrink for _, b in half]
        deviations = sorted(self._deviations)
        spread = 1.4826 * deviations[len(deviations) // 2]
        if len(deviations) < 8:  # too few yet: the pooled noise, which errs towards seeing no settling
            spread = max(spread, pooled_cv)
        spread = max(spread, self.min_spread)
        settled_from = 0
        half_steps = sum(max(b.steps, 1) for _, b in half)
        for i, (_, block) in enumerate(timed[: (2 * len(timed)) // 3]):
            limit = self.standard_errors * spread * math.sqrt(1 / max(block.steps, 1) + 1 / half_steps)
            if abs(block.power_w / level - 1.0) > limit:
                settled_from = i + 1
        self.seconds.append(timed[settled_from][0] if settled_from < len(timed) else elapsed_s)
        return settled_from
