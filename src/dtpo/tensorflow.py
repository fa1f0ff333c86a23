"""``dtpo.tensorflow``: dtpo for TensorFlow custom training loops (``tf.function`` + ``strategy.run``).

:class:`Tracker` reports each step of the loop (and waits for the device only where a window of steps closes);
``dtpo launch --framework tensorflow`` starts the workers with the ``TF_CONFIG`` that
``tf.distribute.MultiWorkerMirroredStrategy`` reads. Keras's ``Model.fit`` is measured by dtpo's Keras callback
instead. Needs the ``tensorflow`` extra (``pip install 'dtpo[tensorflow]'``).
"""

from dtpo.frameworks.tf_tracker import Tracker

__all__ = ["Tracker"]
