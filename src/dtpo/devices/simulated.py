"""Simulated GPUs: :class:`Device` objects whose power limit and SM clock change their step time and power.

Time and power come from a :class:`dtpo.devices.physics.gpu_model.GpuModel` (calibrated on measured traces,
or the parametric physical model). A simulated GPU adds what real ones have: seeded noise on time and power,
an energy counter that only updates every ``counter_period_s`` (like NVML's), an optional slowdown factor (a
straggler), and its own simulated clock, so a whole tuning run takes milliseconds.

Knob state lives in a small JSON file, not in memory, so crash tests are real: a process that sets a limit and
dies with SIGKILL leaves the file changed, and the journal entry it wrote first lets the next dtpo start put
the original settings back (:func:`reopen_simulated` reopens the GPUs from their file). The GPUs of one
data-parallel job share ONE file and one knob key (:class:`SimulatedGpuGroup`): every GPU runs the same
settings, so a setting is one journal entry and one file write however many GPUs there are. The file exists
only while the settings differ from the defaults (maximum power limit, clocks floating): putting the defaults
back deletes it, and a missing file means the defaults. So neither a normal exit nor a restore after
``kill -9`` leaves files behind.

A simulated GPU may also be calibrated on a user's own measured trace (``SimulatedGpuConfig.trace_file``, a CSV
in the Zeus columns, :mod:`dtpo.devices.physics.user_trace`); :func:`model_for` builds the model of any config.
The state file stores the config, trace file included (as an absolute path), so a crashed job's GPUs reopen
with their model; if the trace file is gone or no longer reads by then, they reopen with their knobs only
(all a restore needs: the GPU's power-limit range and clocks).

Energy from a simulated GPU is never a measurement: its source is ``"simulated"`` and it is marked estimated.
"""

from __future__ import annotations

import json
import logging
import math
import os
import weakref
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from dtpo.core.errors import ConfigError
from dtpo.core.record import write_json_atomic
from dtpo.devices.base import Device, DeviceError, DeviceInfo, KnobError, KnobLimits, KnobState
from dtpo.devices.physics.gpu_model import CalibratedModel, GpuModel, OperatingPoint, load_model
from dtpo.devices.physics.power_specs import PowerSpec, find_power_spec
from dtpo.devices.physics.user_trace import load_trace_file, pick_trace

log = logging.getLogger(__name__)

STATE_SCHEMA = "dtpo.simulated-gpus/1"
LEGACY_STATE_SCHEMA = "dtpo.simulated-gpu/1"  # one file per GPU (dtpo before the shared file); still restorable


@dataclass(frozen=True)
class SimulatedGpuConfig:
    """Everything that defines a simulated GPU (stored in its state file).

    Attributes:
        gpu: GPU model key, e.g. ``"A40"`` or ``"H100-SXM"`` (with ``trace_file``: the GPU it was measured on).
        workload: Workload, e.g. ``"resnet50"``. With ``trace_file`` it picks the file's trace:
            ``"network"``, ``"network/dataset"`` or ``"network/dataset/optimizer"``; ``""``: the file's only one.
        batch_size: Samples per step on this GPU (``None``: the model's default; with ``trace_file``: picks the
            file's trace of that batch size, and is the batch of a file without a ``batch_size`` column).
        calibrated: Use the calibrated model (``None``: where a trace exists; a trace file is always calibrated,
            so ``False`` is refused with one).
        index: Device index, for its name (in a group: the first GPU's index).
        seed: Seed of its noise.
        time_noise: Relative standard deviation of step time.
        power_noise: Relative standard deviation of power.
        counter_period_s: The energy counter advances only at multiples of this period (0: continuously).
        slowdown: Step-time factor; above 1 makes this GPU a straggler.
        trace_file: A user's measured power-limit sweep (CSV, Zeus columns) to calibrate on, instead of the
            shipped traces; ``None``: the shipped traces or the parametric model.
    """

    gpu: str
    workload: str
    batch_size: int | None = None
    calibrated: bool | None = None
    index: int = 0
    seed: int = 0
    time_noise: float = 0.01
    power_noise: float = 0.01
    counter_period_s: float = 0.1
    slowdown: float = 1.0
    trace_file: str | None = None

    def validate(self) -> None:
        """Raise :class:`ConfigError` for values no GPU could have."""
        if self.trace_file is not None:
            if not str(self.trace_file).strip():
                raise ConfigError("the trace file name is empty")
            if self.calibrated is False:
                raise ConfigError("a measured trace file gives a calibrated model; the parametric model cannot "
                                  "use one")
        for name, value in (("time noise", self.time_noise), ("power noise", self.power_noise)):
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"{name} must be a finite number >= 0 (a relative standard deviation, e.g. "
                                  f"0.01), got {value:g}")
        if not math.isfinite(self.counter_period_s) or self.counter_period_s < 0:
            raise ConfigError(f"counter period must be a finite number >= 0 s, got {self.counter_period_s:g}")
        if not math.isfinite(self.slowdown) or self.slowdown <= 0:
            raise ConfigError(f"slowdown factor must be a finite number > 0, got {self.slowdown:g}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError(f"batch size must be >= 1, got {self.batch_size}")
        if self.seed < 0:
            raise ConfigError(f"seed must be >= 0, got {self.seed}")
        if self.index < 0:
            raise ConfigError(f"GPU index must be >= 0, got {self.index}")


class KnobStateFile:
    """The knob state shared by one or more simulated GPUs, in one JSON file.

    The file is written only while the state differs from ``default`` and deleted when it returns to it, so
    a missing file means the defaults. Besides the state it holds what is needed to reopen the GPUs after a
    crash: their configuration, how many there are, and which are slower.

    Args:
        path: The file.
        config: The first GPU's configuration (``index`` and ``slowdown`` are per GPU).
        gpus: How many GPUs share it.
        slowdowns: Slowdown factor by GPU position (0-based) where it is not 1.
        default: The settings a GPU starts at.
    """

    def __init__(self, path: Path, config: SimulatedGpuConfig, gpus: int, slowdowns: Mapping[int, float],
                 default: KnobState) -> None:
        self.path = Path(path)
        if config.trace_file is not None:  # a restore after a crash may run in another folder
            config = replace(config, trace_file=os.path.abspath(config.trace_file))
        self.config = config
        self.gpus = gpus
        self.slowdowns = dict(slowdowns)
        self.default = default
        self.state = self.read()

    def read(self) -> KnobState:
        """The state in the file (another process may have changed it); the defaults when there is none."""
        if not self.path.exists():
            self.state = self.default
            return self.state
        data = read_state_file(self.path)
        locked = data.get("locked_sm_clocks_mhz")
        self.state = KnobState(float(data["power_limit_w"]), (int(locked[0]), int(locked[1])) if locked else None)
        return self.state

    def write(self, state: KnobState) -> None:
        """Keep ``state``: write the file, or delete it when ``state`` is the default."""
        try:
            if state == self.default:
                self.path.unlink(missing_ok=True)
            else:
                write_json_atomic(self.path, {
                    "schema": STATE_SCHEMA, "pid": os.getpid(), "config": asdict(self.config), "gpus": self.gpus,
                    "slowdowns": {str(k): v for k, v in sorted(self.slowdowns.items())},
                    "power_limit_w": state.power_limit_w,
                    "locked_sm_clocks_mhz": list(state.locked_sm_clocks_mhz) if state.locked_sm_clocks_mhz else None})
        except OSError as exc:
            raise DeviceError(f"cannot write simulated GPU state {self.path}: {exc.strerror or exc}") from None
        self.state = state

    def remove(self) -> None:
        """Delete the file whatever it holds (once the job is over and nothing needs restoring)."""
        self.path.unlink(missing_ok=True)


class _SimulatedKnobs(Device):
    """Knobs backed by a :class:`KnobStateFile`, checked against the model's datasheet range."""

    model: GpuModel
    store: KnobStateFile
    info: DeviceInfo

    @property
    def spec(self) -> PowerSpec:
        """The simulated GPU's power spec (its knob range)."""
        return self.model.spec

    @property
    def state_path(self) -> Path:
        """The knob-state file (present only while the settings differ from the defaults)."""
        return self.store.path

    @property
    def knob_key(self) -> str | None:
        """``"sim:<state file>"`` (shared by every GPU of a group)."""
        return f"sim:{self.store.path}"

    def knob_limits(self) -> KnobLimits | None:
        """The simulated GPU's datasheet range and supported SM clocks."""
        spec = self.spec
        return KnobLimits(spec.min_power_w, spec.max_power_w, spec.max_power_w, tuple(spec.sm_clocks_mhz))

    def knob_state(self) -> KnobState:
        """The settings in the state file (another process may have changed them)."""
        return self.store.read()

    def sm_clock_mhz(self) -> float | None:
        """The clock the model settles at under the current settings."""
        return operating_point(self.model, self.store.state).sm_clock_mhz

    def set_power_limit(self, watts: float) -> None:
        """Set the power limit (checked against the range like a driver would)."""
        spec = self.spec
        if not spec.min_power_w <= watts <= spec.max_power_w:
            raise KnobError(f"{self.info.name}: power limit {watts:g} W outside {spec.min_power_w:g}-"
                            f"{spec.max_power_w:g} W")
        self.store.write(KnobState(float(watts), self.knob_state().locked_sm_clocks_mhz))

    def lock_sm_clocks(self, min_mhz: int, max_mhz: int) -> None:
        """Lock SM clocks; the GPU runs at the top of the range unless the power limit holds it lower."""
        clocks = self.spec.sm_clocks_mhz
        if min_mhz > max_mhz or min_mhz not in clocks or max_mhz not in clocks:
            raise KnobError(f"{self.info.name}: SM clocks {min_mhz}-{max_mhz} MHz not supported "
                            f"({clocks[0]}-{clocks[-1]} MHz)")
        self.store.write(KnobState(self.knob_state().power_limit_w, (int(min_mhz), int(max_mhz))))

    def unlock_sm_clocks(self) -> None:
        """Let SM clocks float again."""
        self.store.write(KnobState(self.knob_state().power_limit_w, None))

    def forget_state_file(self) -> None:
        """Delete the state file (once the job is over and the settings are restored)."""
        self.store.remove()


def _default_state(model: GpuModel) -> KnobState:
    return KnobState(model.spec.max_power_w, None)


def model_for(config: SimulatedGpuConfig) -> GpuModel:
    """The GPU model a config simulates: calibrated on its trace file, or :func:`load_model` without one.

    With ``config.trace_file`` the file is read (:func:`dtpo.devices.physics.user_trace.load_trace_file`, on
    ``config.gpu``) and its trace named by ``config.workload`` and ``config.batch_size`` is picked
    (:func:`dtpo.devices.physics.user_trace.pick_trace`); the model is a
    :class:`dtpo.devices.physics.gpu_model.CalibratedModel` of it. The file is read on every call (it is small),
    so a changed file is seen.

    Raises:
        ConfigError: A bad config, GPU, workload or batch size, or a bad trace file (one line naming the file,
            row and column), or several traces in the file that match (the message lists them).
    """
    config.validate()
    if config.trace_file is None:
        return load_model(config.gpu, config.workload, config.batch_size, config.calibrated)
    traces = load_trace_file(config.trace_file, config.gpu, batch_size=config.batch_size)
    return CalibratedModel(pick_trace(traces, config.workload or None, config.batch_size))


_POINTS: weakref.WeakKeyDictionary[GpuModel, dict[KnobState, OperatingPoint]] = weakref.WeakKeyDictionary()


def operating_point(model: GpuModel, state: KnobState) -> OperatingPoint:
    """``model`` at the settings ``state`` (an SM-clock lock counts by its top), computed once per model and state."""
    points = _POINTS.setdefault(model, {})
    point = points.get(state)
    if point is None:
        lock = state.locked_sm_clocks_mhz[1] if state.locked_sm_clocks_mhz else None
        point = points[state] = model.at(state.power_limit_w, lock)
    return point


class SimulatedGpu(_SimulatedKnobs):
    """A GPU that exists only in a model, with real knob semantics and a simulated clock.

    Alone (``SimulatedGpu(config, state_path)``) it has its own state file; as a member of a
    :class:`SimulatedGpuGroup` it shares the group's, and changing its knobs changes every GPU of the group.

    Args:
        config: What it simulates.
        state_path: Its knob-state file; read if present (the defaults if not).
        store: The group's state (instead of ``state_path``).
        model: The group's model of ``config`` (saves looking it up once per GPU).
    """

    def __init__(self, config: SimulatedGpuConfig, state_path: Path | None = None, *,
                 store: KnobStateFile | None = None, model: GpuModel | None = None) -> None:
        if model is None:
            model = model_for(config)
        self.config = config
        self.model = model
        if store is None:
            if state_path is None:
                raise ConfigError("a simulated GPU needs a state file or a group's state")
            store = KnobStateFile(Path(state_path), replace(config, slowdown=1.0), 1,
                                  {0: config.slowdown} if config.slowdown != 1.0 else {}, _default_state(self.model))
        self.store = store
        spec = self.model.spec
        kind = "calibrated" if self.model.calibrated else "parametric"
        straggler = f", {config.slowdown:g}x slower" if config.slowdown != 1.0 else ""
        self.info = DeviceInfo(
            name=f"sim{config.index} ({spec.name}, {self.model.workload}{straggler})", kind="gpu",
            source="simulated", estimated=True, node_shared=False,
            detail=f"{kind} model; " + "; ".join(self.model.assumptions))
        self._rng = np.random.default_rng([config.seed, config.index])
        self.now_s = 0.0  # the simulated clock
        self._energy_j = 0.0  # true cumulative energy
        self._energy_before = 0.0  # true energy when the latest advance began
        self._counter_j = 0.0  # what the counter shows: the true energy at its latest update
        self._last_power_w = operating_point(self.model, self.store.default).idle_power_w

    # -- Device -----------------------------------------------------------------------------------------

    def energy_j(self) -> float:
        """Energy as the counter shows it: the true energy at the latest multiple of the counter period."""
        return self._energy_j if self.config.counter_period_s <= 0 else self._counter_j

    def _tick_counter(self, start_s: float, times: np.ndarray, joules: np.ndarray) -> None:
        """Move the counter to the latest period boundary the clock passed while running ``times`` seconds of
        intervals spending ``joules`` each (in order, from ``start_s``), interpolating inside the interval the
        boundary falls in, so the counter reads what the GPU really spent up to that instant."""
        period = self.config.counter_period_s
        if period <= 0:
            return
        boundary = math.floor(self.now_s / period) * period
        if boundary <= start_s:
            return
        ends = np.cumsum(times)
        spent = np.cumsum(joules)
        offset = boundary - start_s
        i = int(np.searchsorted(ends, offset, side="left"))
        if i >= len(ends):
            self._counter_j = self._energy_j
            return
        begin_t = ends[i - 1] if i else 0.0
        begin_j = spent[i - 1] if i else 0.0
        share = (offset - begin_t) / times[i] if times[i] > 0 else 1.0
        self._counter_j = self._energy_before + float(begin_j + share * (spent[i] - begin_j))

    def power_w(self) -> float | None:
        """Power during the latest simulated interval."""
        return self._last_power_w

    # -- the simulation ---------------------------------------------------------------------------------

    def operating_point(self) -> OperatingPoint:
        """Where the model puts this GPU at its current knob settings (before noise and slowdown)."""
        return operating_point(self.model, self.store.state)

    def sample_steps(self, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """Compute times (s) and powers (W) of ``steps`` steps at the current settings, with noise.

        Nothing advances; pass the times to :meth:`advance` once the job knows how long each rank waited.
        """
        point = self.operating_point()
        step_s = point.time_per_sample_s * self.model.batch_size * self.config.slowdown
        times = step_s * (1.0 + self.config.time_noise * self._rng.standard_normal(steps))
        powers = point.power_w * (1.0 + self.config.power_noise * self._rng.standard_normal(steps))
        return np.maximum(times, 0.05 * step_s), np.maximum(powers, 0.0)

    def advance(self, compute_s: np.ndarray, power_w: np.ndarray, wait_s: np.ndarray | float = 0.0) -> float:
        """Move the simulated clock over computing intervals and the waits after them.

        Args:
            compute_s: Seconds spent computing, per step.
            power_w: Board power while computing, per step.
            wait_s: Seconds spent waiting (for stragglers, a collective) after each step, at idle power.

        Returns:
            Joules spent over these steps.
        """
        idle_w = self.operating_point().idle_power_w
        compute_s = np.asarray(compute_s, dtype=float)
        if np.ndim(wait_s) == 0:
            wait_total, last_wait = float(wait_s) * compute_s.size, float(wait_s)
        else:
            wait = np.asarray(wait_s, dtype=float)
            wait_total, last_wait = float(wait.sum()), float(wait[-1]) if wait.size else 0.0
        joules = float(compute_s @ power_w) + wait_total * idle_w
        start = self.now_s
        self._energy_before = self._energy_j
        self.now_s += float(compute_s.sum()) + wait_total
        self._energy_j += joules
        if self.config.counter_period_s > 0 and compute_s.size:
            waits = np.broadcast_to(np.asarray(wait_s, dtype=float), compute_s.shape)
            times = np.stack([compute_s, waits], axis=1).ravel()
            spent = np.stack([compute_s * np.asarray(power_w, dtype=float), waits * idle_w], axis=1).ravel()
            self._tick_counter(start, times, spent)
        if compute_s.size:
            self._last_power_w = idle_w if last_wait > 0 else float(power_w[-1])
        return joules

    def idle(self, seconds: float) -> float:
        """Sit idle for ``seconds`` of simulated time; returns the joules spent."""
        idle_w = self.operating_point().idle_power_w
        start = self.now_s
        self._energy_before = self._energy_j
        self.now_s += seconds
        self._energy_j += seconds * idle_w
        self._tick_counter(start, np.array([seconds]), np.array([seconds * idle_w]))
        self._last_power_w = idle_w
        return seconds * idle_w


class SimulatedGpuGroup(_SimulatedKnobs):
    """The GPUs of one data-parallel job: one state file, one knob key, the same settings on every GPU.

    As a :class:`Device` it reports the GPUs' total energy and power; its knobs set every GPU at once.

    Args:
        config: The first GPU's configuration; GPU ``i`` gets index ``config.index + i``.
        gpus: How many GPUs.
        state_path: The shared knob-state file; read if present (the defaults if not).
        slowdowns: Slowdown factor by GPU position (0-based), for stragglers; 1 elsewhere.
        model: The model of ``config`` when the caller has it (default: :func:`model_for`).
    """

    def __init__(self, config: SimulatedGpuConfig, gpus: int, state_path: Path,
                 slowdowns: Mapping[int, float] | None = None, model: GpuModel | None = None) -> None:
        if gpus < 1:
            raise ConfigError(f"a group of simulated GPUs needs at least one GPU, got {gpus}")
        slowdowns = {int(k): float(v) for k, v in (slowdowns or {}).items() if float(v) != 1.0}
        if any(not 0 <= k < gpus for k in slowdowns):
            raise ConfigError(f"slowdowns name GPUs outside 0-{gpus - 1}: {sorted(slowdowns)}")
        config = replace(config, slowdown=1.0)
        config.validate()
        self.config = config
        self.model = model if model is not None else model_for(config)
        self.store = KnobStateFile(Path(state_path), config, gpus, slowdowns, _default_state(self.model))
        self.members = [SimulatedGpu(replace(config, index=config.index + i, slowdown=slowdowns.get(i, 1.0)),
                                     store=self.store, model=self.model) for i in range(gpus)]
        last = config.index + gpus - 1
        names = f"sim{config.index}" if gpus == 1 else f"sim{config.index}-{last}"
        self.info = DeviceInfo(
            name=f"{names} ({gpus} x {self.model.spec.name}, {self.model.workload})", kind="gpu",
            source="simulated", estimated=True, node_shared=False, detail=self.members[0].info.detail)

    def energy_j(self) -> float:
        """Total energy as the GPUs' counters show it."""
        return sum(gpu.energy_j() for gpu in self.members)

    def power_w(self) -> float | None:
        """Total power during each GPU's latest simulated interval."""
        return sum(gpu._last_power_w for gpu in self.members)


class _KnobsOnlySimulatedGpus(_SimulatedKnobs):
    """Simulated GPUs reopened from their state file when their trace file no longer gives a model.

    They cannot simulate (no energy, no steps), but their knobs work against the GPU's range, which is all a
    restore needs: putting the defaults back deletes the state file like any simulated GPU's.
    """

    def __init__(self, path: Path, config: SimulatedGpuConfig, gpus: int, slowdowns: Mapping[int, float],
                 reason: str) -> None:
        self._spec = find_power_spec(config.gpu)
        self.config = config
        self.store = KnobStateFile(path, config, gpus, slowdowns, KnobState(self._spec.max_power_w, None))
        last = config.index + gpus - 1
        names = f"sim{config.index}" if gpus == 1 else f"sim{config.index}-{last}"
        self.info = DeviceInfo(name=f"{names} ({gpus} x {self._spec.name}, trace {config.trace_file}: knobs only)",
                               kind="gpu", source="simulated", estimated=True, node_shared=False,
                               detail=f"reopened without a model ({reason})")

    @property
    def spec(self) -> PowerSpec:
        """The GPU's power spec, from its name in the state file."""
        return self._spec

    def energy_j(self) -> float:
        """Nothing runs on them."""
        return 0.0


class _VacantSimulatedGpus(Device):
    """What a journal entry points at when its state file is gone: GPUs at their defaults, nothing to put back."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.info = DeviceInfo(name=f"simulated GPUs of {path} (no state file: at their defaults)", kind="gpu",
                               source="simulated", estimated=True, node_shared=False)

    def energy_j(self) -> float:
        """Nothing runs on them."""
        return 0.0

    @property
    def knob_key(self) -> str | None:
        """``"sim:<state file>"``."""
        return f"sim:{self.path}"

    def knob_state(self) -> KnobState:
        """Unknown defaults; never read by a restore."""
        raise DeviceError(f"simulated GPU state {self.path} is gone")

    def set_power_limit(self, watts: float) -> None:
        """Nothing to change: without a file the GPUs are at their defaults."""

    def lock_sm_clocks(self, min_mhz: int, max_mhz: int) -> None:
        """Nothing to change."""

    def unlock_sm_clocks(self) -> None:
        """Nothing to change."""


def read_state_file(path: Path) -> dict[str, Any]:
    """The parsed state file of simulated GPUs, or a one-line :class:`DeviceError`."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise DeviceError(f"simulated GPU state {path} is gone") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise DeviceError(f"simulated GPU state {path} is unreadable or corrupt ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") not in (STATE_SCHEMA, LEGACY_STATE_SCHEMA) \
            or "power_limit_w" not in data or not isinstance(data.get("config"), dict):
        raise DeviceError(f"{path} is not a simulated GPU state file ({STATE_SCHEMA})")
    return data


def reopen_simulated(path: str | Path) -> Device:
    """Reopen simulated GPUs from their state file (how the journal restores them after a crash).

    A missing file means the GPUs are at their defaults: the device returned then changes nothing, so a
    restore of it succeeds and its journal entry goes. GPUs calibrated on a trace file that is gone (or no
    longer reads) reopen with their knobs only: enough to put their settings back.
    """
    path = Path(path)
    if not path.exists():
        return _VacantSimulatedGpus(path)
    data = read_state_file(path)
    try:
        config = SimulatedGpuConfig(**data["config"])
        gpus = int(data.get("gpus", 1))
        slowdowns = {int(k): float(v) for k, v in (data.get("slowdowns") or {}).items()}
    except (TypeError, ValueError, AttributeError) as exc:
        raise DeviceError(f"simulated GPU state {path} has an unknown configuration ({exc})") from None
    try:
        single = data["schema"] == LEGACY_STATE_SCHEMA or gpus == 1
        if single:
            config = replace(config, slowdown=slowdowns.get(0, config.slowdown))
        try:
            model = model_for(config)
        except ConfigError as exc:
            if config.trace_file is None:
                raise
            log.debug("simulated GPU state %s: its trace file gives no model (%s); reopened with knobs only",
                     path, exc)
            return _KnobsOnlySimulatedGpus(path, replace(config, slowdown=1.0), gpus,
                                           {0: config.slowdown} if single and config.slowdown != 1.0 else slowdowns,
                                           str(exc))
        if single:
            return SimulatedGpu(config, path, model=model)
        return SimulatedGpuGroup(config, gpus, path, slowdowns, model=model)
    except ConfigError as exc:
        raise DeviceError(f"simulated GPU state {path}: {exc}") from None
