"""A simulated GPU: a :class:`Device` whose power limit and SM clock change its step time and power.

Time and power come from a :class:`dtpo.plan.gpu_model.GpuModel` (calibrated on measured traces, or the
parametric physical model). The simulated GPU adds what real ones have: seeded noise on time and power, an
energy counter that only updates every ``counter_period_s`` (like NVML's), an optional slowdown factor (a
straggler), and its own simulated clock, so a whole tuning run takes milliseconds.

Its knob state lives in a small JSON file, not in memory, so crash tests are real: a process that sets a
limit and dies with SIGKILL leaves the file changed, and the journal entry it wrote first lets the next dtpo
start put the original settings back (:func:`reopen_simulated` reopens the device from its file).
Energy from a simulated GPU is never a measurement: its source is ``"simulated"`` and it is marked estimated.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dtpo.core.errors import ConfigError
from dtpo.core.record import write_json_atomic
from dtpo.devices.base import Device, DeviceError, DeviceInfo, KnobError, KnobLimits, KnobState
from dtpo.plan.gpu_model import GpuModel, OperatingPoint, load_model

STATE_SCHEMA = "dtpo.simulated-gpu/1"


@dataclass(frozen=True)
class SimulatedGpuConfig:
    """Everything that defines a simulated GPU (stored in its state file).

    Attributes:
        gpu: GPU model key, e.g. ``"A40"`` or ``"H100-SXM"``.
        workload: Workload, e.g. ``"resnet50"``.
        batch_size: Samples per step on this GPU (``None``: the model's default).
        calibrated: Use the calibrated model (``None``: where a trace exists).
        index: Device index, for its name.
        seed: Seed of its noise.
        time_noise: Relative standard deviation of step time.
        power_noise: Relative standard deviation of power.
        counter_period_s: The energy counter advances only at multiples of this period (0: continuously).
        slowdown: Step-time factor; above 1 makes this GPU a straggler.
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

    def validate(self) -> None:
        """Raise :class:`ConfigError` for values no GPU could have."""
        if self.time_noise < 0 or self.power_noise < 0:
            raise ConfigError("noise must be >= 0 (a relative standard deviation, e.g. 0.01)")
        if not math.isfinite(self.counter_period_s) or self.counter_period_s < 0:
            raise ConfigError(f"counter period must be >= 0 s, got {self.counter_period_s:g}")
        if not math.isfinite(self.slowdown) or self.slowdown <= 0:
            raise ConfigError(f"slowdown factor must be > 0, got {self.slowdown:g}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError(f"batch size must be >= 1, got {self.batch_size}")


class SimulatedGpu(Device):
    """A GPU that exists only in a model, with real knob semantics and a simulated clock.

    Args:
        config: What it simulates.
        state_path: Its knob-state file; created at the default settings if absent, read if present.
    """

    def __init__(self, config: SimulatedGpuConfig, state_path: Path) -> None:
        config.validate()
        self.config = config
        self.model: GpuModel = load_model(config.gpu, config.workload, config.batch_size, config.calibrated)
        self.state_path = Path(state_path)
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
        self._last_power_w = self.model.at().idle_power_w
        self._point_cache: dict[KnobState, OperatingPoint] = {}
        if not self.state_path.exists():
            self._write_state(KnobState(spec.max_power_w, None))
        self._state = self._read_state()

    # -- Device -----------------------------------------------------------------------------------------

    def energy_j(self) -> float:
        """Energy as the counter shows it: it last updated at the latest multiple of the counter period."""
        period = self.config.counter_period_s
        if period <= 0:
            return self._energy_j
        behind = self.now_s - math.floor(self.now_s / period) * period
        return max(0.0, self._energy_j - behind * self._last_power_w)

    def power_w(self) -> float | None:
        """Power during the latest simulated interval."""
        return self._last_power_w

    # -- knobs ------------------------------------------------------------------------------------------

    @property
    def knob_key(self) -> str | None:
        """``"sim:<state file>"``."""
        return f"sim:{self.state_path}"

    def knob_limits(self) -> KnobLimits | None:
        """The simulated GPU's datasheet range and supported SM clocks."""
        spec = self.model.spec
        return KnobLimits(spec.min_power_w, spec.max_power_w, spec.max_power_w, tuple(spec.sm_clocks_mhz))

    def knob_state(self) -> KnobState:
        """The settings in the state file (another process may have changed them)."""
        self._state = self._read_state()
        return self._state

    def set_power_limit(self, watts: float) -> None:
        """Set the power limit (checked against the range like a driver would)."""
        spec = self.model.spec
        if not spec.min_power_w <= watts <= spec.max_power_w:
            raise KnobError(f"{self.info.name}: power limit {watts:g} W outside {spec.min_power_w:g}-"
                            f"{spec.max_power_w:g} W")
        self._write_state(KnobState(float(watts), self.knob_state().locked_sm_clocks_mhz))

    def lock_sm_clocks(self, min_mhz: int, max_mhz: int) -> None:
        """Lock SM clocks; the GPU runs at the top of the range unless the power limit holds it lower."""
        clocks = self.model.spec.sm_clocks_mhz
        if min_mhz > max_mhz or min_mhz not in clocks or max_mhz not in clocks:
            raise KnobError(f"{self.info.name}: SM clocks {min_mhz}-{max_mhz} MHz not supported "
                            f"({clocks[0]}-{clocks[-1]} MHz)")
        self._write_state(KnobState(self.knob_state().power_limit_w, (int(min_mhz), int(max_mhz))))

    def unlock_sm_clocks(self) -> None:
        """Let SM clocks float again."""
        self._write_state(KnobState(self.knob_state().power_limit_w, None))

    # -- the simulation ---------------------------------------------------------------------------------

    def operating_point(self) -> OperatingPoint:
        """Where the model puts this GPU at its current knob settings (before noise and slowdown)."""
        state = self._state
        point = self._point_cache.get(state)
        if point is None:
            lock = state.locked_sm_clocks_mhz[1] if state.locked_sm_clocks_mhz else None
            point = self.model.at(state.power_limit_w, lock)
            self._point_cache[state] = point
        return point

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
        wait = np.broadcast_to(np.asarray(wait_s, dtype=float), np.shape(compute_s))
        joules = float(np.dot(compute_s, power_w) + wait.sum() * idle_w)
        self.now_s += float(np.sum(compute_s) + wait.sum())
        self._energy_j += joules
        if np.size(compute_s):
            last_wait = float(wait[-1])
            self._last_power_w = idle_w if last_wait > 0 else float(power_w[-1])
        return joules

    def idle(self, seconds: float) -> float:
        """Sit idle for ``seconds`` of simulated time; returns the joules spent."""
        idle_w = self.operating_point().idle_power_w
        self.now_s += seconds
        self._energy_j += seconds * idle_w
        self._last_power_w = idle_w
        return seconds * idle_w

    def forget_state_file(self) -> None:
        """Delete the state file (once the job is over and the settings are restored)."""
        self.state_path.unlink(missing_ok=True)

    # -- the state file ---------------------------------------------------------------------------------

    def _write_state(self, state: KnobState) -> None:
        data: dict[str, Any] = {"schema": STATE_SCHEMA, "config": asdict(self.config),
                                "power_limit_w": state.power_limit_w,
                                "locked_sm_clocks_mhz": list(state.locked_sm_clocks_mhz)
                                if state.locked_sm_clocks_mhz else None}
        try:
            write_json_atomic(self.state_path, data)
        except OSError as exc:
            raise DeviceError(f"cannot write simulated GPU state {self.state_path}: {exc.strerror or exc}") from None
        self._state = state

    def _read_state(self) -> KnobState:
        data = read_state_file(self.state_path)
        locked = data.get("locked_sm_clocks_mhz")
        return KnobState(float(data["power_limit_w"]), (int(locked[0]), int(locked[1])) if locked else None)


def read_state_file(path: Path) -> dict[str, Any]:
    """The parsed state file of a simulated GPU, or a one-line :class:`DeviceError`."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise DeviceError(f"simulated GPU state {path} is gone") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise DeviceError(f"simulated GPU state {path} is unreadable or corrupt ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != STATE_SCHEMA or "power_limit_w" not in data \
            or not isinstance(data.get("config"), dict):
        raise DeviceError(f"{path} is not a simulated GPU state file ({STATE_SCHEMA})")
    return data


def reopen_simulated(path: str | Path) -> SimulatedGpu:
    """Reopen a simulated GPU from its state file (how the journal restores one after a crash)."""
    data = read_state_file(Path(path))
    try:
        config = SimulatedGpuConfig(**data["config"])
    except TypeError as exc:
        raise DeviceError(f"simulated GPU state {path} has an unknown configuration ({exc})") from None
    try:
        return SimulatedGpu(config, Path(path))
    except ConfigError as exc:
        raise DeviceError(f"simulated GPU state {path}: {exc}") from None
