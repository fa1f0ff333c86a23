"""Callbacks for the training libraries people use, for users who prefer code to ``dtpo launch``'s agent.

Each is a thin wrapper over :class:`~dtpo.session.step_reporter.StepReporter` and feeds the same step stream
(record, energy windows, GPU knobs and their tuner, live metrics): it starts the reporter when training starts,
reports each optimizer step's end with its samples, and finishes it when training ends.

* ``lightning.py``: ``DtpoCallback`` for PyTorch Lightning's ``Trainer`` (a ``pytorch_lightning.Callback``).
* ``transformers.py``: ``DtpoCallback`` for the Hugging Face ``transformers`` ``Trainer`` (a ``TrainerCallback``).

Importing this package needs neither library; each module imports its own.
"""
