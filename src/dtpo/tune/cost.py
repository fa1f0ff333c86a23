"""Cost metrics: what a tuner minimises, as small strategies over time and energy per sample.

Every metric judges a setting by two measured figures of the whole job: wall time per trained sample
(``time_per_sample_s``) and energy per trained sample over all GPUs (``energy_per_sample_j``), plus a
:class:`CostContext` (how many GPUs, their maximum power limit). The linear metrics are
``a * time + b * energy``; :class:`MaxSlowdown` minimises energy among settings no slower than a factor of
the default setting.

* :class:`Energy`: joules per sample.
* :class:`Time`: seconds per sample.
* :class:`ZeusCost`: Zeus's ``eta * energy + (1 - eta) * max_power * time``, where ``max_power`` is the
  maximum power limit times the number of GPUs (Zeus's ``ZeusCost`` selector with its ``world_size``).
* :class:`MaxSlowdown`: least energy among settings whose time is at most ``factor`` times the default's.
* :class:`Dollars`: the energy bill plus the GPU rental, per sample:
  ``energy / 3.6e6 * price_per_kwh + time * gpus / 3600 * price_per_gpu_hour``.

:func:`parse_cost` reads the command-line form: ``energy``, ``time``, ``zeus:ETA``, ``slowdown:FACTOR``,
``dollars:PRICE_PER_KWH,PRICE_PER_GPU_HOUR``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

from dtpo.core.errors import ConfigError

COST_FORMS = "energy, time, zeus:ETA, slowdown:FACTOR, dollars:PRICE_PER_KWH,PRICE_PER_GPU_HOUR"
JOULES_PER_KWH = 3.6e6


@dataclass(frozen=True)
class CostContext:
    """What a metric needs to know about the job besides time and energy.

    Attributes:
        gpus: GPUs the job runs on (all tuned together).
        max_power_w: The largest power limit one GPU allows (Zeus's ``max_power`` per GPU).
    """

    gpus: int = 1
    max_power_w: float = 0.0


class CostMetric(ABC):
    """A cost per trained sample; lower is better."""

    name: str
    unit: str

    @abstractmethod
    def per_sample(self, time_per_sample_s: float, energy_per_sample_j: float, context: CostContext) -> float:
        """The cost of one trained sample at this time and energy per sample."""

    def weights(self, context: CostContext) -> tuple[float, float]:
        """``(a, b)`` with cost ``a * time + b * energy``: what a tuner's confidence intervals are built on."""
        return 0.0, 1.0

    def feasible(self, time_per_sample_s: float, default_time_per_sample_s: float) -> bool:
        """Whether a setting is allowed at all given the default setting's time (only MaxSlowdown refuses)."""
        return True

    def describe(self) -> str:
        """The metric in words, for tables and the record."""
        return self.name

    def __str__(self) -> str:
        return self.name


class _Linear(CostMetric):
    def per_sample(self, time_per_sample_s: float, energy_per_sample_j: float, context: CostContext) -> float:
        a, b = self.weights(context)
        return a * time_per_sample_s + b * energy_per_sample_j


class Energy(_Linear):
    """Joules per sample (all GPUs)."""

    name = "energy"
    unit = "J/sample"

    def describe(self) -> str:
        """See :meth:`CostMetric.describe`."""
        return "energy per sample"


class Time(_Linear):
    """Seconds of wall time per sample."""

    name = "time"
    unit = "s/sample"

    def weights(self, context: CostContext) -> tuple[float, float]:
        """Time only."""
        return 1.0, 0.0

    def describe(self) -> str:
        """See :meth:`CostMetric.describe`."""
        return "time per sample"


class ZeusCost(_Linear):
    """Zeus's time-energy cost ``eta * E + (1 - eta) * max_power * T`` per sample.

    Args:
        eta: Weight of energy, in [0, 1].
    """

    unit = "J/sample"

    def __init__(self, eta: float) -> None:
        if not (math.isfinite(eta) and 0.0 <= eta <= 1.0):
            raise ConfigError(f"zeus cost eta must be between 0 and 1, got {eta:g}")
        self.eta = float(eta)
        self.name = f"zeus:{self.eta:g}"

    def weights(self, context: CostContext) -> tuple[float, float]:
        """``a = (1 - eta) * max_power * gpus``, ``b = eta``."""
        if context.max_power_w <= 0:
            raise ConfigError("the zeus cost needs the GPUs' maximum power limit")
        return (1.0 - self.eta) * context.max_power_w * context.gpus, self.eta

    def describe(self) -> str:
        """See :meth:`CostMetric.describe`."""
        return f"Zeus cost, eta {self.eta:g}"


class MaxSlowdown(_Linear):
    """Least energy among settings at most ``factor`` times slower than the default setting.

    Args:
        factor: Allowed slowdown, >= 1 (1.1: at most 10 % slower).
    """

    unit = "J/sample"

    def __init__(self, factor: float) -> None:
        if not (math.isfinite(factor) and factor >= 1.0):
            raise ConfigError(f"slowdown factor must be >= 1 (1.1 allows 10 % slower), got {factor:g}")
        self.factor = float(factor)
        self.name = f"slowdown:{self.factor:g}"

    def feasible(self, time_per_sample_s: float, default_time_per_sample_s: float) -> bool:
        """At most ``factor`` times the default setting's time."""
        return time_per_sample_s <= self.factor * default_time_per_sample_s

    def describe(self) -> str:
        """See :meth:`CostMetric.describe`."""
        return f"energy, at most {(self.factor - 1) * 100:.3g} % slower"


class Dollars(_Linear):
    """Energy bill plus GPU rental per sample.

    Args:
        price_per_kwh: Electricity price per kWh.
        price_per_gpu_hour: Rental price of one GPU for one hour.
    """

    unit = "$/sample"

    def __init__(self, price_per_kwh: float, price_per_gpu_hour: float) -> None:
        for what, value in (("price per kWh", price_per_kwh), ("price per GPU-hour", price_per_gpu_hour)):
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"dollars cost: {what} must be a finite number >= 0, got {value:g}")
        if price_per_kwh == 0 and price_per_gpu_hour == 0:
            raise ConfigError("dollars cost: both prices are 0, so every setting costs nothing")
        self.price_per_kwh = float(price_per_kwh)
        self.price_per_gpu_hour = float(price_per_gpu_hour)
        self.name = f"dollars:{self.price_per_kwh:g},{self.price_per_gpu_hour:g}"

    def weights(self, context: CostContext) -> tuple[float, float]:
        """``a = price_per_gpu_hour * gpus / 3600``, ``b = price_per_kwh / 3.6e6``."""
        return self.price_per_gpu_hour * context.gpus / 3600.0, self.price_per_kwh / JOULES_PER_KWH

    def describe(self) -> str:
        """See :meth:`CostMetric.describe`."""
        return f"dollars ({self.price_per_kwh:g}/kWh + {self.price_per_gpu_hour:g}/GPU-hour)"


def parse_cost(text: str) -> CostMetric:
    """The metric named by ``text`` (see the module docs for the forms).

    Raises:
        ConfigError: Unknown name or bad parameters, in one line that lists the forms.
    """
    name, sep, arg = str(text).strip().lower().partition(":")

    def number(value: str, what: str) -> float:
        try:
            return float(value)
        except ValueError:
            raise ConfigError(f"--cost {text!r}: {what} must be a number") from None

    if name in ("energy", "time") and not sep:
        return Energy() if name == "energy" else Time()
    if name == "zeus" and sep:
        return ZeusCost(number(arg, "eta"))
    if name == "slowdown" and sep:
        return MaxSlowdown(number(arg, "the slowdown factor"))
    if name == "dollars" and sep:
        kwh, comma, gpuh = arg.partition(",")
        if not comma:
            raise ConfigError(f"--cost {text!r}: write dollars:PRICE_PER_KWH,PRICE_PER_GPU_HOUR, e.g. dollars:0.15,2.5")
        return Dollars(number(kwh, "the price per kWh"), number(gpuh, "the price per GPU-hour"))
    raise ConfigError(f"unknown cost metric {text!r}; choose one of: {COST_FORMS}")
