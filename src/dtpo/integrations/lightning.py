"""``DtpoCallback`` for PyTorch Lightning: the ``Trainer``'s optimizer steps as dtpo's step stream::

    from dtpo.integrations.lightning import DtpoCallback

    trainer = pl.Trainer(..., callbacks=[DtpoCallback()])

A thin wrapper over :class:`~dtpo.session.step_reporter.StepReporter`: started in ``on_train_start`` (the
process group Lightning made is joined, not made anew), one ``step()`` per optimizer step (a training batch after
which ``trainer.global_step`` moved on; the samples of the batches since the previous one, from the batches
themselves), finished in ``on_train_end`` (or ``on_exception``, with the error). Under ``dtpo launch`` the
launcher's agent stands aside for it.
"""

from __future__ import annotations

import math
import os
from typing import Any

try:
    import pytorch_lightning as pl
except ImportError:  # the unified ``lightning`` package
    import lightning.pytorch as pl  # type: ignore[no-redef]

from dtpo.core.config import TuneConfig
from dtpo.session.loop.batch_size import count_samples, count_tokens
from dtpo.session.step_reporter import StepReporter


class DtpoCallback(pl.Callback):
    """Reports each optimizer step of a Lightning ``Trainer`` to dtpo.

    Args:
        run_dir: Where rank 0 writes ``record.json`` (default: ``$DTPO_RUN_DIR`` or ``runs/<run-id>``).
        tune: What to tune while training (GPU knobs: ``TuneConfig(knob="power-limit")``).
        options: Further :class:`~dtpo.session.step_reporter.StepReporter` arguments (``warmup_steps``,
            ``energy``, ``progress``, ``summary``, ...); progress is off by default (Lightning shows its own).

    Attributes:
        reporter: The reporter of the running fit (``None`` before it starts).
    """

    def __init__(self, run_dir: str | os.PathLike[str] | None = None, tune: TuneConfig | None = None,
                 **options: Any) -> None:
        super().__init__()
        self.run_dir = run_dir
        self.tune = tune
        self.options = {"progress": False, **options}
        self.reporter: StepReporter | None = None
        self._global_step = 0
        self._samples = 0
        self._tokens: int | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        estimated = trainer.estimated_stepping_batches
        total = int(estimated) if isinstance(estimated, int | float) and math.isfinite(estimated) else None
        self.reporter = StepReporter(total_steps=total, run_dir=self.run_dir, tune=self.tune,
                                     device=pl_module.device, **self.options)
        self._global_step, self._samples, self._tokens = trainer.global_step, 0, None
        self.reporter.start()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.reporter is None:
            return
        self._samples += count_samples(batch, default=0)
        tokens = count_tokens(batch)
        if tokens is not None:
            self._tokens = (self._tokens or 0) + tokens
        if trainer.global_step == self._global_step:  # accumulating: no optimizer step yet
            return
        self._global_step = trainer.global_step
        self.reporter.step(samples=self._samples, tokens=self._tokens)
        self._samples, self._tokens = 0, None

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._finish(None)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._finish(exception)

    def _finish(self, error: BaseException | None) -> None:
        reporter, self.reporter = self.reporter, None
        if reporter is not None:
            reporter.finish(error)
