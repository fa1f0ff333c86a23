"""A delay inside a CPU step's compute that stands for a virtual GPU's simulated slowdown.

On virtual GPUs made with slow steps (``dtpo virtual-gpus create --slow-steps``) the CPU still computes at its own
pace, whatever power limit or clock the GPU holds. To let a tuning run trade time as it would on the GPU, the
Session waits, before each backward, ``(factor - 1)`` times the compute the step would take: its forward so far
times :data:`COMPUTE_PER_FORWARD` (forward and backward together take about three forwards). The record says so
(a note of the energy section), and the summary's step times then hold simulated seconds: never a measurement.
"""

from __future__ import annotations

import time
from collections.abc import Callable

COMPUTE_PER_FORWARD = 3.0  # forward + backward ~ 3 forwards (backward ~ 2x forward)


class ComputeSlowdown:
    """Waits inside compute as long as the simulated slowdown at the GPU's setting in force adds.

    Args:
        factor: The step-time factor now (``None``: no slowdown to add), read before every backward.
        sleep: How to wait (injectable for tests).
        clock: Seconds, on the clock the Session's CPU timer marks with.
    """

    def __init__(self, factor: Callable[[], float | None], sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._factor = factor
        self._sleep = sleep
        self._clock = clock
        self.added_s = 0.0  # simulated seconds added so far

    def wait(self, forward_started: float) -> float:
        """Wait for the slowdown of the forward that started at ``forward_started``; returns the seconds waited."""
        factor = self._factor()
        if factor is None or factor <= 1.0:
            return 0.0
        extra = (factor - 1.0) * COMPUTE_PER_FORWARD * max(self._clock() - forward_started, 0.0)
        self._sleep(extra)
        self.added_s += extra
        return extra
