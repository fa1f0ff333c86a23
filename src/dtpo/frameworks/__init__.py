"""Training scripts that compute with JAX, TensorFlow or Keras, measured and tuned like PyTorch ones.

The GPU knobs, the tuner, energy and the record do not care which framework computes; only the step stream
does. Each framework reports its steps through :class:`~dtpo.frameworks.steps.FrameworkSteps` (a
:class:`~dtpo.session.step_reporter.StepReporter` that never touches the GPU through torch, and waits for the
device only where a window of steps closes), and dtpo's own collectives go over a torch gloo group
(:mod:`~dtpo.frameworks.channel`) beside the framework's own. ``dtpo launch --framework`` prepares each worker as
its framework needs before the script runs (:mod:`~dtpo.frameworks.bootstrap`: JAX's coordinator, TensorFlow's
``TF_CONFIG``).
"""
