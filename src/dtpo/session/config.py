"""The Session's settings, validated where they are declared."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from dtpo.core.errors import ConfigError
from dtpo.devices.knobs import KNOB_MODES
from dtpo.dist.wrap import STRATEGIES
from dtpo.session.precision import PRECISIONS


@dataclass
class SessionConfig:
    """How a :class:`~dtpo.session.session.Session` trains and measures.

    Attributes:
        precision: ``"32-true"``, ``"bf16-mixed"`` (autocast to bfloat16) or ``"16-mixed"`` (autocast to
            float16 with a gradient scaler), as in Lightning.
        strategy: ``"ddp"`` (DistributedDataParallel) or ``"fsdp"`` (FSDP2 ``fully_shard``).
        grad_accum: Micro-batches per optimizer step; gradients sync only on the last one.
        warmup_steps: Optimizer steps left out of totals (DDP rebuilds buckets after the first iteration;
            the first step also counts FLOPs).
        max_grad_norm: Clip gradients to this total norm before each optimizer step, if set.
        count_flops: Count model FLOPs on the first step with ``torch.utils.flop_counter`` (for MFU).
        flush_every: Write this rank's partial record every N steps, so a crash leaves data behind.
    """

    precision: str = "32-true"
    strategy: str = "ddp"
    grad_accum: int = 1
    warmup_steps: int = 2
    max_grad_norm: float | None = None
    count_flops: bool = True
    flush_every: int = 50

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ConfigError(f"unknown precision {self.precision!r} (choose from: {', '.join(PRECISIONS)})")
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"unknown strategy {self.strategy!r} (choose from: {', '.join(STRATEGIES)})")
        if not isinstance(self.grad_accum, int) or self.grad_accum < 1:
            raise ConfigError(f"grad_accum must be an integer >= 1, got {self.grad_accum!r}")
        if self.warmup_steps < 0:
            raise ConfigError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ConfigError(f"max_grad_norm must be positive, got {self.max_grad_norm}")
        if self.flush_every < 1:
            raise ConfigError(f"flush_every must be >= 1, got {self.flush_every}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


@dataclass
class EnergyConfig:
    """How a Session measures energy.

    Attributes:
        enabled: Measure energy at all.
        window_steps: Optimizer steps per energy window.
        sample_interval_s: Period of the background power timeline; ``None`` for no timeline.
        cpu_tdp_w: TDP in watts of the CPUs this node exposes, for the modelled CPU (default: a table by
            processor model, else a per-CPU default; the record says which).
        grid_g_per_kwh: Carbon intensity of the electricity, grams CO2-equivalent per kWh (default: the
            world average of about 475 g/kWh; set your grid's figure).
        price_per_kwh: Price of a kWh, for the cost figure (no cost is computed without it).
        currency: Currency of ``price_per_kwh``.
    """

    enabled: bool = True
    window_steps: int = 10
    sample_interval_s: float | None = 0.1
    cpu_tdp_w: float | None = None
    grid_g_per_kwh: float = 475.0
    price_per_kwh: float | None = None
    currency: str = "USD"

    def __post_init__(self) -> None:
        if self.window_steps < 1:
            raise ConfigError(f"energy window_steps must be >= 1, got {self.window_steps}")
        if self.sample_interval_s is not None and self.sample_interval_s <= 0:
            raise ConfigError(f"power sample interval must be positive, got {self.sample_interval_s:g}")
        if self.cpu_tdp_w is not None and self.cpu_tdp_w <= 0:
            raise ConfigError(f"--cpu-tdp must be positive, got {self.cpu_tdp_w:g}")
        if self.grid_g_per_kwh < 0:
            raise ConfigError(f"grid intensity must be >= 0 g/kWh, got {self.grid_g_per_kwh:g}")
        if self.price_per_kwh is not None and self.price_per_kwh < 0:
            raise ConfigError(f"price per kWh must be >= 0, got {self.price_per_kwh:g}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


@dataclass
class KnobConfig:
    """GPU knobs a Session sets on this rank's GPU for the run, and restores at the end.

    Attributes:
        power_limit_w: Power limit in watts, if any.
        sm_clock_mhz: Lock SM clocks at this supported frequency, if any.
        mode: ``"apply"`` (change the GPU; falls back to ``observe`` without permission), ``"dry-run"`` (log
            what would be set, touch nothing) or ``"observe"`` (touch nothing).
    """

    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    mode: str = "apply"

    def __post_init__(self) -> None:
        if self.mode not in KNOB_MODES:
            raise ConfigError(f"unknown knob mode {self.mode!r} (choose from: {', '.join(KNOB_MODES)})")
        if self.power_limit_w is not None and not self.power_limit_w > 0:
            raise ConfigError(f"--power-limit must be a positive number of watts, got {self.power_limit_w:g}")
        if self.sm_clock_mhz is not None and self.sm_clock_mhz <= 0:
            raise ConfigError(f"--sm-clock must be a positive number of MHz, got {self.sm_clock_mhz}")

    @property
    def requested(self) -> bool:
        """True when any knob is to be set."""
        return self.power_limit_w is not None or self.sm_clock_mhz is not None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)
