"""dtpo for Keras 3: :class:`DtpoCallback` reports each training batch of ``Model.fit`` (TensorFlow, JAX or
PyTorch backend) to dtpo's step stream::

    from dtpo.keras import DtpoCallback

    model.fit(x, y, epochs=3, callbacks=[DtpoCallback()])

Under ``dtpo launch --framework keras`` no code change is needed: the agent adds one to every ``Model.fit``.
See :mod:`dtpo.frameworks.keras_callback`.
"""

from __future__ import annotations

from dtpo.frameworks.keras_callback import DtpoCallback, FitAborted

__all__ = ["DtpoCallback", "FitAborted"]
