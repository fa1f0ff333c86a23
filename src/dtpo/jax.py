"""``dtpo.jax``: JAX training loops measured and tuned by dtpo (see :mod:`dtpo.frameworks.jax_tracker`).

::

    from dtpo.jax import Tracker

    with Tracker(total_steps=1000) as tracker:
        for x, y in batches:
            params, loss = train_step(params, x, y)
            tracker.step(loss, batch=x)
"""

from dtpo.frameworks.jax_tracker import Tracker, batch_rows, step_flops
from dtpo.frameworks.tracker import PRECISIONS

__all__ = ["PRECISIONS", "Tracker", "batch_rows", "step_flops"]
