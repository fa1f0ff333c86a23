"""Every ``Model.fit`` of an unmodified Keras 3 script measured: :func:`measure_fit`, called by the agent of
``dtpo launch`` once ``import keras`` has finished.

``keras.Model.fit`` is wrapped (once; :func:`unmeasure_fit` takes the wrapper off) so that:

* a fit without a :class:`~dtpo.frameworks.keras_callback.DtpoCallback` gets one, made from the launch's
  :class:`~dtpo.core.config.RunConfig` (``--tune``, knobs, energy, the run directory) and
  ``DTPO_SAMPLES_PER_STEP``, with errors of dtpo's own logged instead of raised into the script;
* a fit that already has one (the script's own) keeps it, and no second one is added;
* a fit that raises finishes its callback's run with the error (Keras has no hook for it): the record keeps what
  was measured, ``failed``, and the exception reaches the script unchanged.

**One run per process.** A launch has one run directory per job, and a run is finished (its record gathered
from every rank) where its fit ends, while every rank is still in step. So the first fit of a process is
measured; a later fit (fine-tuning after a first phase, another model) runs unmeasured, said once in the log.
A script that wants each fit measured passes its own ``DtpoCallback(run_dir=...)`` to each.
"""

from __future__ import annotations

import functools
import inspect
import logging
from pathlib import Path
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

_MARK = "__dtpo_measured__"


class _Measure:
    """What the wrapper keeps between fits: the settings, and whether this process's run was taken."""

    def __init__(self, samples: int | None, config_path: str | Path | None) -> None:
        self.samples = samples
        self.config_path = config_path
        self.taken = False

    def callback_for(self, model: Any, callbacks: Any) -> tuple[Any, Any]:
        """``(callbacks to pass to fit, the DtpoCallback that measures it or None)``."""
        from dtpo.frameworks.keras_callback import DtpoCallback

        listed = list(getattr(callbacks, "callbacks", None) or []) if _is_callback_list(callbacks) else \
            list(callbacks or []) if isinstance(callbacks, list | tuple) else [callbacks] if callbacks else []
        own = next((cb for cb in listed if isinstance(cb, DtpoCallback)), None)
        if own is not None:
            self.taken = True
            return callbacks, own
        if self.taken:
            log.info("dtpo: this process measured its first Model.fit; a later fit runs unmeasured (one run per "
                     "process: pass DtpoCallback(run_dir=...) to measure each)")
            return callbacks, None
        self.taken = True
        callback = DtpoCallback(samples_per_step=self.samples, guarded=True, **self._options())
        if _is_callback_list(callbacks):  # a CallbackList of the script's own: join it as Keras would have
            callbacks.callbacks.insert(0, callback)
            callback.set_model(model)
            callback.set_params(getattr(callbacks, "params", None) or {})
            return callbacks, callback
        return [callback, *listed], callback

    def _options(self) -> dict[str, Any]:
        if not self.config_path:
            return {}
        from dtpo.core.config import RunConfig

        return {"run_config": RunConfig.load(self.config_path)}


def measure_fit(keras: ModuleType, samples: int | None = None, config_path: str | Path | None = None) -> None:
    """Wrap ``keras.Model.fit`` so that every fit reports its steps to dtpo (see the module's docstring).

    Args:
        keras: The ``keras`` module, just imported.
        samples: ``DTPO_SAMPLES_PER_STEP``: samples per step on this process where dtpo cannot count them.
        config_path: The launch's ``RunConfig`` file (``RUN_DIR/config.json``), if any.
    """
    model_class = keras.Model
    original = model_class.fit
    if getattr(original, _MARK, False):
        return
    try:
        position = list(inspect.signature(original).parameters).index("callbacks") - 1  # after self
    except (TypeError, ValueError):
        position = None
    measure = _Measure(samples, config_path)

    @functools.wraps(original)
    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        callback = None
        try:
            if position is not None and len(args) > position:
                new, callback = measure.callback_for(self, args[position])
                args = (*args[:position], new, *args[position + 1:])
            else:
                kwargs["callbacks"], callback = measure.callback_for(self, kwargs.get("callbacks"))
        except Exception as exc:  # noqa: BLE001 - the script's fit runs on, unmeasured
            log.warning("dtpo: cannot measure this Model.fit (%s: %s); it runs unmeasured", type(exc).__name__, exc)
        try:
            return original(self, *args, **kwargs)
        except BaseException as exc:
            _finish(callback, exc)
            raise

    setattr(fit, _MARK, True)
    fit.__dtpo_original__ = original  # type: ignore[attr-defined]
    fit.__dtpo_owned__ = "fit" in model_class.__dict__  # type: ignore[attr-defined]
    model_class.fit = fit


def unmeasure_fit(keras: ModuleType) -> None:
    """Take :func:`measure_fit`'s wrapper off ``keras.Model.fit`` (nothing where it is not on)."""
    model_class = keras.Model
    fit = model_class.__dict__.get("fit")
    if not getattr(fit, _MARK, False):
        return
    if fit.__dtpo_owned__:
        model_class.fit = fit.__dtpo_original__
    else:
        del model_class.fit


def _finish(callback: Any, error: BaseException) -> None:
    """End the failed fit's run with its error; never raise instead of it."""
    if callback is None or callback.steps is None:
        return
    try:
        callback.finish(error)
    except Exception as exc:  # noqa: BLE001 - the script's own exception matters more
        log.warning("dtpo: could not write this rank's record of the failed fit (%s: %s)", type(exc).__name__, exc)


def _is_callback_list(callbacks: Any) -> bool:
    return type(callbacks).__name__ == "CallbackList" and isinstance(getattr(callbacks, "callbacks", None), list)
