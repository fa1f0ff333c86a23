"""``dtpo.keras.DtpoCallback`` and the agent's ``Model.fit`` wrapper, in this process, on the Keras backend this
machine defaults to (``KERAS_BACKEND``, else ``~/.keras/keras.json``): exact steps and samples (the partial last
batch, two epochs, validation outside), a fit that raises, one run per process. The launch tests
(``test_keras_launch.py``) run every backend on two ranks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from frameworks.support import needs

pytestmark = [needs("keras"), pytest.mark.framework]

QUIET = {"energy": False, "summary": False, "progress": False}


@pytest.fixture(scope="module")
def keras() -> Any:
    import keras

    return keras


def small_model(keras: Any) -> Any:
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def data(samples: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(samples, 6)).astype("float32"), rng.integers(0, 3, size=(samples,)).astype("float32")


class Boom(RuntimeError):
    """The script's own error inside fit."""


def raise_at(keras: Any, batch: int) -> Any:
    class Raise(keras.callbacks.Callback):
        def on_train_batch_begin(self, index: int, logs: Any = None) -> None:
            if index == batch:
                raise Boom(f"batch {index}")

    return Raise()


def samples_per_step(record: Any) -> list[int]:
    return [step.samples for step in record.ranks[0].steps]


def test_every_training_batch_is_a_step_with_its_own_samples(keras: Any, tmp_path: Path) -> None:
    from dtpo.core.record import RunRecord
    from dtpo.keras import DtpoCallback

    x, y = data(43)  # batches of 8: 5 full and one of 3, each epoch
    callback = DtpoCallback(run_dir=tmp_path / "run", **QUIET)
    small_model(keras).fit(x, y, batch_size=8, epochs=2, validation_data=data(20), verbose=0, callbacks=[callback])
    record = RunRecord.load(tmp_path / "run")
    assert record.status == "completed"
    assert samples_per_step(record) == [8, 8, 8, 8, 8, 3] * 2  # validation batches are no steps
    assert record.config["user"]["framework"] == f"keras/{keras.backend.backend()}"
    assert callback.steps is None and callback.record is not None


def test_steps_per_execution_reports_one_step_per_execution(keras: Any, tmp_path: Path) -> None:
    from dtpo.core.record import RunRecord
    from dtpo.keras import DtpoCallback

    if keras.backend.backend() == "torch":
        pytest.skip("Keras's torch backend runs one batch per execution")
    model = small_model(keras)
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=2)
    x, y = data(43)  # 6 batches: 3 executions, the last one holding 8 + 3
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[DtpoCallback(run_dir=tmp_path / "run", **QUIET)])
    assert samples_per_step(RunRecord.load(tmp_path / "run")) == [16, 16, 11]


def test_a_generator_counts_samples_per_step_only_where_told(keras: Any, tmp_path: Path) -> None:
    from dtpo.core.record import RunRecord
    from dtpo.keras import DtpoCallback

    def batches() -> Any:
        x, y = data(40)
        for start in range(0, 40, 10):
            yield x[start:start + 10], y[start:start + 10]

    small_model(keras).fit(batches(), epochs=1, verbose=0, shuffle=False,
                           callbacks=[DtpoCallback(run_dir=tmp_path / "run", samples_per_step=7, **QUIET)])
    counted = samples_per_step(RunRecord.load(tmp_path / "run"))
    assert len(counted) == 4
    # JAX and PyTorch see the generator's batches pass; TensorFlow pulls them inside its graph
    assert counted == ([7] * 4 if keras.backend.backend() == "tensorflow" else [10] * 4)


def test_a_fit_that_raises_leaves_a_failed_partial_record_through_the_wrapper(keras: Any, tmp_path: Path) -> None:
    from dtpo.core.config import RunConfig
    from dtpo.core.record import load_partial_records
    from dtpo.frameworks.keras_fit import measure_fit, unmeasure_fit

    config = RunConfig().replace(energy={"enabled": False}, launch={"run_dir": str(tmp_path / "run")})
    measure_fit(keras, None, config.save(tmp_path / "config.json"))
    try:
        x, y = data(43)
        with pytest.raises(Boom):  # the script's own exception, unchanged
            small_model(keras).fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[raise_at(keras, 4)])
    finally:
        unmeasure_fit(keras)
    assert "fit" not in keras.Model.__dict__ or not hasattr(keras.Model.fit, "__dtpo_measured__")
    (partial,) = load_partial_records(tmp_path / "run")
    assert partial.status == "failed" and "batch 4" in (partial.error or "")
    assert samples_per_step(partial) == [8, 8, 8, 8]  # the batch that raised never trained


def test_a_callback_of_your_own_after_a_raising_fit_is_finished_by_the_next_fit(keras: Any, tmp_path: Path) -> None:
    from dtpo.core.record import RunRecord, load_partial_records
    from dtpo.keras import DtpoCallback

    first = DtpoCallback(run_dir=tmp_path / "first", **QUIET)
    x, y = data(24)
    model = small_model(keras)
    with pytest.raises(Boom):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[first, raise_at(keras, 2)])
    assert first.steps is not None  # Keras has no hook for it: still open
    first.run_dir = tmp_path / "second"
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[first])
    (partial,) = load_partial_records(tmp_path / "first")
    assert partial.status == "failed" and "on_train_end" in (partial.error or "")
    assert samples_per_step(partial) == [8, 8]
    assert samples_per_step(RunRecord.load(tmp_path / "second")) == [8, 8, 8]


def test_the_wrapper_adds_one_callback_keeps_yours_and_measures_one_fit_per_process(keras: Any, tmp_path: Path,
                                                                                    monkeypatch: pytest.MonkeyPatch
                                                                                    ) -> None:
    from dtpo.core.record import RunRecord
    from dtpo.frameworks import keras_fit
    from dtpo.keras import DtpoCallback

    made: list[DtpoCallback] = []
    real = DtpoCallback.__init__

    def init(self: DtpoCallback, *args: Any, **kwargs: Any) -> None:
        made.append(self)
        real(self, *args, **{**kwargs, **QUIET})

    monkeypatch.setattr(DtpoCallback, "__init__", init)
    monkeypatch.setenv("DTPO_RUN_DIR", str(tmp_path / "agent"))
    keras_fit.measure_fit(keras, 5, None)
    keras_fit.measure_fit(keras, 5, None)  # once only
    try:
        x, y = data(16)
        model = small_model(keras)
        model.fit(x, y, 8, 1, 0)  # callbacks not given: the wrapper adds its own
        assert len(made) == 1 and made[0].guarded
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # a second fit: unmeasured
        assert len(made) == 1
        own = DtpoCallback(run_dir=tmp_path / "own")
        model.fit(x, y, 8, 1, 0, [own])  # the script's own callback: kept, no second one
        assert len(made) == 2 and own.record is not None
    finally:
        keras_fit.unmeasure_fit(keras)
    assert not getattr(keras.Model.fit, "__dtpo_measured__", False)
    assert samples_per_step(RunRecord.load(tmp_path / "agent")) == [8, 8]
    assert samples_per_step(RunRecord.load(tmp_path / "own")) == [8, 8]


def test_a_process_counts_its_share_of_a_global_batch() -> None:
    from dtpo.frameworks.keras_callback import _share, local_samples

    class Extended:
        worker_devices = ("cpu:0",)

    class Resolver:
        task_id = 1

    class Strategy:
        num_replicas_in_sync = 2
        extended = Extended()
        cluster_resolver = Resolver()

    share = _share(Strategy())
    assert [share(16), share(5), share(3), share(1)] == [8, 2, 1, 0]  # TensorFlow: 5 over 2 replicas is 3 and 2
    Resolver.task_id = 0
    assert [_share(Strategy())(5), _share(None)(5)] == [3, 5]
    assert local_samples((np.zeros((4, 2)), np.zeros(4))) == 4
    assert local_samples(({"a": np.zeros((3, 1))}, None)) == 3
    assert local_samples(([], None)) == 0


def test_a_callback_left_open_by_a_raising_fit_is_finished_at_exit(keras: Any, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from dtpo.core.record import load_partial_records
    from dtpo.keras import DtpoCallback

    callback = DtpoCallback(run_dir=tmp_path / "run", **QUIET)
    x, y = data(24)
    with pytest.raises(Boom):
        small_model(keras).fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[callback, raise_at(keras, 1)])
    monkeypatch.delattr("sys.last_value", raising=False)
    callback._at_exit()  # what atexit runs
    (partial,) = load_partial_records(tmp_path / "run")
    assert partial.status == "failed" and "never returned" in (partial.error or "")
    assert callback.steps is None


def test_the_built_in_workload_is_measured_by_the_agents_wrapper(keras: Any, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from dtpo.core.record import RunRecord
    from dtpo.frameworks.keras_fit import measure_fit, unmeasure_fit
    from dtpo.workloads import keras_mlp

    monkeypatch.setenv("DTPO_RUN_DIR", str(tmp_path / "run"))
    measure_fit(keras, None, None)
    try:
        loss = keras_mlp.train(steps=3, batch_size=8, lr=1e-3, seed=0)
    finally:
        unmeasure_fit(keras)
    assert np.isfinite(loss)
    assert samples_per_step(RunRecord.load(tmp_path / "run")) == [8, 8, 8]
