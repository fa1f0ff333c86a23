"""Tuning: the knobs a run can turn, the cost metrics that judge a setting, and the tuners that search.

A tuner is a state machine fed measured blocks or windows of steps, never a training loop: the power and clock
tuner (:class:`~dtpo.tune.tuner.PowerTuner`, a driver composing a search policy chosen from the metric,
:mod:`~dtpo.tune.race` or :mod:`~dtpo.tune.bound_search`, with a hold policy, :mod:`~dtpo.tune.hold_refine`),
per-rank straggler slowdown (:mod:`~dtpo.tune.straggler`), and the job knobs' settings and convergence guard.
The same tuners drive real GPUs (from ``session``) and simulated ones (from ``simulation``).
"""
