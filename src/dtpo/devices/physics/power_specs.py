"""Power and clock figures of the GPUs dtpo can simulate.

One :class:`PowerSpec` per simulatable GPU: the power-limit range a driver accepts, the supported SM clocks,
datasheet throughput and bandwidth, and three constants of the physical power model in
:mod:`dtpo.devices.physics.gpu_model` (static power and the shape of the voltage/frequency curve).

Where the figures come from (each spec's ``source`` says it again):

* Power-limit range and clocks: what ``nvidia-smi -q -d POWER,SUPPORTED_CLOCKS`` reports on these parts
  (A40, V100 PCIe, A100 SXM4, H100 SXM5). NVIDIA lists application SM clocks every 15 MHz from the lowest to
  the boost clock; Volta lists them about every 7.5 MHz (1380, 1372, 1365, ... MHz). AMD exposes a min/max
  range instead of a list; for the MI250X the simulator uses a 15 MHz grid and its power-cap floor is an
  estimate (not published).
* Peak FP16 tensor FLOP/s (dense): :mod:`dtpo.devices.physics.catalogue`, except the V100, whose catalogue entry is the
  300 W SXM2 part: the traced V100 is the 250 W PCIe card (112 TFLOP/s).
* Idle power: typical ``nvidia-smi``/``rocm-smi`` readings of an idle board; estimates, good to +-30 %.
* Model constants (``static_power_w``, ``v_floor``, ``v_knee``): for the A40 and V100 they are fitted to the
  measured Zeus traces. A grid search (static power in 5-10 W steps, ``v_floor`` and ``v_knee`` in 0.05
  steps) scored each candidate by how well the parametric model, with workload constants fitted per trace,
  places the energy-optimal power limit of the traces whose optimum is well resolved (the criterion the
  tests use) and by the rms error of time and power. For the V100 the chosen values sit in a region where
  neighbouring candidates do about as well; for the A40 that region is narrow (most A40 workloads are
  power-limited even at 300 W, their measured optima alternate between 175 and 200 W, and the model's
  common optimum for them must land in 180-192 W), so treat the A40's constants as a calibration, not a
  measurement. For the other GPUs they are estimates: static power = idle + 7 % of the maximum limit
  (leakage at operating temperature; the rule reproduces the A40's fitted 50 W, the V100's fit is idle
  + 5 W), and the V/f curve is the mean of the two fitted ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dtpo.core.errors import ConfigError
from dtpo.devices.physics.catalogue import GPUS

TERA = 1e12
GIGA = 1e9


@dataclass(frozen=True)
class PowerSpec:
    """What a simulated GPU allows and the constants of its power model.

    Attributes:
        name: Canonical key: ``"A40"``, ``"V100"``, ``"H100-SXM"``, ``"A100-SXM"`` or ``"MI250X"``.
        max_power_w: Highest (and default) power limit.
        min_power_w: Lowest settable power limit.
        idle_power_w: Board power of an idle GPU.
        max_sm_mhz: Highest supported SM clock (the boost clock).
        min_sm_mhz: Lowest supported SM clock.
        sm_clocks_mhz: Supported SM clocks in MHz, ascending (what a clock lock accepts).
        peak_flops: Peak dense FP16 tensor FLOP/s at the boost clock.
        memory_bandwidth_bps: Peak memory bandwidth in bytes per second.
        source: Where the figures come from.
        static_power_w: Board power of a busy GPU that does not depend on the SM clock (idle power, memory,
            leakage): the power model's ``P_static``.
        v_floor: Core voltage at and below the knee, as a fraction of the voltage at the boost clock.
        v_knee: Clock (as a fraction of ``max_sm_mhz``) above which voltage rises linearly to its maximum.
        fitted: True when the three model constants were fitted to measured traces of this GPU.
        aliases: Other names :func:`find_power_spec` accepts (lower case).
    """

    name: str
    max_power_w: float
    min_power_w: float
    idle_power_w: float
    max_sm_mhz: int
    min_sm_mhz: int
    sm_clocks_mhz: tuple[int, ...]
    peak_flops: float
    memory_bandwidth_bps: float
    source: str
    static_power_w: float
    v_floor: float
    v_knee: float
    fitted: bool = False
    aliases: tuple[str, ...] = ()


def _clock_grid(low: int, high: int, step: float) -> tuple[int, ...]:
    """Supported clocks from ``high`` down in steps of ``step`` (rounded down to whole MHz), ascending."""
    count = int(round((high - low) / step))
    return tuple(sorted({int(math.floor(high - k * step + 1e-9)) for k in range(count + 1)}))


def _catalogue_fp16(name: str) -> float:
    """Peak FP16 tensor FLOP/s from the catalogue entry named ``name``."""
    for spec in GPUS:
        if spec.name == name:
            return spec.fp16
    raise KeyError(name)  # a bug: the catalogue lost an entry this module relies on


_UNTRACED_NOTE = ("datasheet power limits, clocks, FLOP/s and bandwidth; idle power a typical reading; "
                  "static power and V/f curve estimated (idle + 7 % of max power; mean of the fitted A40/V100 "
                  "curves)")

POWER_SPECS: tuple[PowerSpec, ...] = (
    PowerSpec(
        name="A40", max_power_w=300.0, min_power_w=100.0, idle_power_w=30.0,
        max_sm_mhz=1740, min_sm_mhz=210, sm_clocks_mhz=_clock_grid(210, 1740, 15),
        peak_flops=_catalogue_fp16("NVIDIA A40"), memory_bandwidth_bps=696 * GIGA,
        source="NVIDIA A40 datasheet (300 W, 1740 MHz boost, 696 GB/s); nvidia-smi limits 100-300 W; "
               "model constants fitted to the Zeus NSDI'23 A40 traces",
        static_power_w=50.0, v_floor=0.65, v_knee=0.65, fitted=True, aliases=("a40", "nvidia a40")),
    PowerSpec(
        name="V100", max_power_w=250.0, min_power_w=100.0, idle_power_w=25.0,
        max_sm_mhz=1380, min_sm_mhz=135, sm_clocks_mhz=_clock_grid(135, 1380, 7.5),
        peak_flops=112 * TERA, memory_bandwidth_bps=900 * GIGA,
        source="NVIDIA V100 PCIe datasheet (250 W, 1380 MHz boost, 112 TFLOP/s FP16 tensor, 900 GB/s); "
               "nvidia-smi limits 100-250 W; model constants fitted to the Zeus NSDI'23 V100 traces",
        static_power_w=30.0, v_floor=0.65, v_knee=0.55, fitted=True,
        aliases=("v100", "v100-pcie", "v100 pcie", "tesla v100", "nvidia v100")),
    PowerSpec(
        name="H100-SXM", max_power_w=700.0, min_power_w=200.0, idle_power_w=70.0,
        max_sm_mhz=1980, min_sm_mhz=345, sm_clocks_mhz=_clock_grid(345, 1980, 15),
        peak_flops=_catalogue_fp16("NVIDIA H100 SXM"), memory_bandwidth_bps=3350 * GIGA,
        source="NVIDIA H100 SXM5 80GB datasheet (700 W, 1980 MHz boost, 3.35 TB/s); nvidia-smi limits "
               "200-700 W; " + _UNTRACED_NOTE,
        static_power_w=119.0, v_floor=0.65, v_knee=0.60,
        aliases=("h100", "h100-sxm", "h100 sxm", "h100-sxm5", "h100 sxm5", "nvidia h100")),
    PowerSpec(
        name="A100-SXM", max_power_w=400.0, min_power_w=100.0, idle_power_w=50.0,
        max_sm_mhz=1410, min_sm_mhz=210, sm_clocks_mhz=_clock_grid(210, 1410, 15),
        peak_flops=_catalogue_fp16("NVIDIA A100"), memory_bandwidth_bps=2039 * GIGA,
        source="NVIDIA A100 SXM4 80GB datasheet (400 W, 1410 MHz boost, 2.04 TB/s); nvidia-smi limits "
               "100-400 W; " + _UNTRACED_NOTE,
        static_power_w=78.0, v_floor=0.65, v_knee=0.60,
        aliases=("a100", "a100-sxm", "a100 sxm", "a100-sxm4", "a100 sxm4", "nvidia a100")),
    PowerSpec(
        name="MI250X", max_power_w=560.0, min_power_w=200.0, idle_power_w=90.0,
        max_sm_mhz=1700, min_sm_mhz=500, sm_clocks_mhz=_clock_grid(500, 1700, 15),
        peak_flops=_catalogue_fp16("AMD Instinct MI250X"), memory_bandwidth_bps=3277 * GIGA,
        source="AMD Instinct MI250X datasheet (one OAM, both GCDs: 560 W, 1700 MHz peak engine clock, "
               "3.28 TB/s); power-cap floor 200 W and 500 MHz lowest clock are estimates; " + _UNTRACED_NOTE,
        static_power_w=129.0, v_floor=0.65, v_knee=0.60,
        aliases=("mi250x", "mi250", "amd mi250x", "instinct mi250x")),
)


def power_spec_names() -> list[str]:
    """Canonical names of every simulatable GPU."""
    return [spec.name for spec in POWER_SPECS]


def find_power_spec(name: str) -> PowerSpec:
    """The spec of a GPU by canonical name or alias, case-insensitively.

    Raises:
        ConfigError: Unknown name (the message lists the choices).
    """
    key = name.strip().lower()
    for spec in POWER_SPECS:
        if key == spec.name.lower() or key in spec.aliases:
            return spec
    raise ConfigError(f"unknown GPU model {name!r}; choose one of {', '.join(power_spec_names())}")
