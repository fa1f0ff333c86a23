"""Which optimizer steps are training iterations, and which batches belong to them: the agent's bookkeeping.

An unmodified script says nothing about its steps; the agent sees only torch's calls. :class:`StepCounter`
turns the optimizer calls into iterations: only the outermost ``step()`` counts when optimizers wrap
optimizers (``ZeroRedundancyOptimizer``, Horovod's ``DistributedOptimizer``, EMA wrappers call an inner
optimizer's ``step()`` from their own), a ``GradScaler.step()`` that skipped the optimizer on inf/NaN still
counts, and with several optimizers (a GAN's generator and discriminator) the one that has stepped most is the
clock. :class:`LoaderChoice` tells the training data loader from the others (evaluation, a sanity check): the
loader that yielded the last batch before each iteration's end is the training loader from then on, and only
its batches open and fill a step, so evaluation between steps stays out of them.
"""

from __future__ import annotations

from collections import Counter
from typing import Any


class StepCounter:
    """Outermost optimizer steps, and which optimizer is the clock.

    Call :meth:`enter` when an optimizer's ``step()`` (or ``GradScaler.step()``) begins and :meth:`leave` when
    it returns; :meth:`leave` says whether that was an iteration of the training loop.

    Attributes:
        counts: Outermost steps per optimizer (by ``id``).
        clock: The optimizer whose steps are the iterations (``None`` before the first).
    """

    def __init__(self) -> None:
        self.counts: Counter[int] = Counter()
        self.clock: int | None = None
        self._depth = 0
        self._outer: int | None = None

    @property
    def inside(self) -> bool:
        """Whether an optimizer step is running."""
        return self._depth > 0

    def enter(self, optimizer: Any) -> None:
        """An optimizer's step begins (the first one entered is the outermost)."""
        if self._depth == 0:
            self._outer = id(optimizer)
        self._depth += 1

    def leave(self) -> bool:
        """An optimizer's step returned (or raised). Returns whether the outermost step of the clock optimizer
        just ended: one iteration of the training loop."""
        if self._depth == 0:  # a step that began before the agent was installed
            return False
        self._depth -= 1
        if self._depth or self._outer is None:
            return False
        key, self._outer = self._outer, None
        self.counts[key] += 1
        if self.clock is None or self.counts[key] > self.counts[self.clock]:
            self.clock = key
        return key == self.clock


class LoaderChoice:
    """Tells the training data loader's batches from the others'.

    Attributes:
        training: The loader (an opaque key) whose batches make the steps; ``None`` until the first step ends,
            while any loader's batch counts. A step that got no batch of it but did of another loader (the
            script moved on to another training loader) makes that one the training loader.
    """

    def __init__(self) -> None:
        self.training: Any = None
        self._counted: Any = None  # the loader of the step's last counted batch
        self._other: Any = None  # the loader of the step's last batch that did not count

    def counts(self, loader: Any) -> bool:
        """Whether a batch of ``loader`` belongs to the training steps."""
        return self.training is None or loader == self.training

    def yielded(self, loader: Any) -> None:
        """``loader`` handed out a batch."""
        if self.counts(loader):
            self._counted = loader
        else:
            self._other = loader

    def step_ended(self) -> None:
        """An iteration ended: the loader of its last batch is the training loader."""
        chosen = self._counted if self._counted is not None else self._other
        if chosen is not None:
            self.training = chosen
        self._counted = self._other = None
