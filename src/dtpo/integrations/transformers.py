"""``DtpoCallback`` for the Hugging Face ``transformers`` ``Trainer``: its optimizer steps as dtpo's step stream::

    from dtpo.integrations.transformers import DtpoCallback

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[DtpoCallback()])

A thin wrapper over :class:`~dtpo.session.step_reporter.StepReporter`: started in ``on_train_begin`` (the
process group the Trainer made is joined, not made anew), one ``step()`` per ``on_step_end`` (an optimizer
step), finished in ``on_train_end``. Samples (and tokens) are those of the model's training forwards since the
previous step, counted by a forward pre-hook on the model (the batches the Trainer fetched ahead and never
trained on do not count); where no forward was seen, ``per_device_train_batch_size`` times
``gradient_accumulation_steps``. Under ``dtpo launch`` the launcher's agent stands aside for it.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from transformers import TrainerCallback

from dtpo.core.config import TuneConfig
from dtpo.session.loop.batch_size import count_samples, count_tokens
from dtpo.session.step_reporter import StepReporter


class DtpoCallback(TrainerCallback):
    """Reports each optimizer step of a ``transformers`` ``Trainer`` to dtpo.

    Args:
        run_dir: Where rank 0 writes ``record.json`` (default: ``$DTPO_RUN_DIR`` or ``runs/<run-id>``).
        tune: What to tune while training (GPU knobs: ``TuneConfig(knob="power-limit")``).
        options: Further :class:`~dtpo.session.step_reporter.StepReporter` arguments (``warmup_steps``,
            ``energy``, ``progress``, ``summary``, ...); progress is off by default (the Trainer shows its own).

    Attributes:
        reporter: The reporter of the running ``train()`` (``None`` before it starts).
    """

    def __init__(self, run_dir: str | os.PathLike[str] | None = None, tune: TuneConfig | None = None,
                 **options: Any) -> None:
        self.run_dir = run_dir
        self.tune = tune
        self.options = {"progress": False, **options}
        self.reporter: StepReporter | None = None
        self._hook: Any = None
        self._samples = 0
        self._tokens: int | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        total = state.max_steps if state.max_steps and state.max_steps > 0 else None
        self.reporter = StepReporter(total_steps=total, run_dir=self.run_dir, tune=self.tune, device=args.device,
                                     **self.options)
        self._samples, self._tokens = 0, None
        if isinstance(model, torch.nn.Module):
            self._hook = model.register_forward_pre_hook(self._forward, with_kwargs=True)
        self.reporter.start()

    def _forward(self, module: torch.nn.Module, positional: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not (module.training and torch.is_grad_enabled()):  # evaluation between steps is no training sample
            return
        inputs = kwargs if kwargs else positional
        self._samples += count_samples(inputs, default=0)
        tokens = count_tokens(inputs)
        if tokens is not None:
            self._tokens = (self._tokens or 0) + tokens

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.reporter is None:
            return
        samples = self._samples or args.per_device_train_batch_size * args.gradient_accumulation_steps
        self.reporter.step(samples=samples, tokens=self._tokens)
        self._samples, self._tokens = 0, None

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        reporter, self.reporter = self.reporter, None
        if reporter is not None:
            reporter.finish()
