"""Power and clock figures of the GPUs dtpo can simulate.

One :class:`PowerSpec` per simulatable GPU: the power-limit range a driver accepts, the supported SM clocks,
datasheet throughput and bandwidth, and three constants of the physical power model in
:mod:`dtpo.devices.physics.gpu_model` (static power and the shape of the voltage/frequency curve).

The catalogue: A40, V100 (PCIe 250 W), H100-SXM, A100-SXM, MI250X, P100-PCIe (16 GB, 250 W), P100-SXM2 (300 W),
T4, RTX6000 (Quadro RTX 6000), A6000 (RTX A6000), L4, L40S, A100-PCIe (80 GB), H100-PCIe, H200 (SXM), B200 (SXM)
and MI300X. ``dtpo simulate list`` prints them with their ranges. A user's trace of any other GPU gets a spec of
its own whose power-limit range is the trace's (:func:`trace_range_spec`).

Where the figures come from (each spec's ``source`` says it again, naming the estimates):

* Maximum power limit: the datasheet's board power (TDP/TBP/TGP), which is also the default limit.
* Minimum power limit: what ``nvidia-smi -q -d POWER`` reports as "Min Power Limit" on the A40, V100 PCIe,
  A100 SXM4, H100 SXM5, and (as recalled from public nvidia-smi logs, not re-measured) the P100 PCIe, T4, L4,
  A100 PCIe and H100 PCIe. Elsewhere it is an estimate and the source says so. AMD does not publish power-cap
  floors: for the MI250X and MI300X they are estimates.
* SM clocks: NVIDIA lists application SM clocks every 15 MHz from the lowest to the boost clock (Ampere, Ada,
  Hopper, Turing); Volta lists them about every 7.5 MHz (1380, 1372, 1365, ... MHz) and Pascal about every
  12.7 MHz (1328, 1316, 1303, ... MHz; the simulator's Pascal grid is that spacing, rounded). Boost clocks are
  the datasheets'; the lowest clock is nvidia-smi's where known, else that of the same architecture (an
  estimate). NVIDIA publishes no B200 clock: its boost clock is a third-party figure. AMD exposes a min/max
  range instead of a list; for the MI250X and MI300X the simulator uses a 15 MHz grid from an estimated
  500 MHz floor to the datasheet's peak engine clock.
* Peak FP16 tensor FLOP/s (dense) and memory bandwidth: :mod:`dtpo.devices.physics.catalogue`, except the V100,
  whose catalogue entry is the 300 W SXM2 part: the traced V100 is the 250 W PCIe card (112 TFLOP/s). The P100
  has no tensor cores: its figure is the datasheet's FP16 peak.
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

**A GPU outside the catalogue** (:func:`trace_range_spec`): its power-limit range is the lowest and highest
limit its trace swept (the default limit is the highest); everything else is an estimate: idle power 10 % of
the maximum (the A40, V100 and H100 idle at about that share), static power idle + 7 % of the maximum, the
A40's clock grid, FLOP/s and bandwidth, and the mean V/f curve. A calibrated model reads time and power off the
trace, so only SM-clock locks and limits beyond the measured ones depend on those estimates. Its name,
``unlisted-<min>-<max>W`` (e.g. ``unlisted-125-250W``), is all :func:`find_power_spec` needs to rebuild it (a
state file reopened after a crash, a run's record).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache

from dtpo.core.errors import ConfigError
from dtpo.devices.physics.catalogue import GPUS, GpuSpec

TERA = 1e12
GIGA = 1e9
STATIC_SHARE = 0.07  # static power = idle + this share of the maximum limit (GPUs without a fitted model)
V_FLOOR, V_KNEE = 0.65, 0.60  # the mean of the fitted A40 (0.65, 0.65) and V100 (0.65, 0.55) V/f curves
TRACE_IDLE_SHARE = 0.10  # idle power of a GPU outside the catalogue, as a share of its maximum limit
TRACE_SPEC_PREFIX = "unlisted"
MAX_TRACE_POWER_W = 10_000.0  # a trace's limits above this are no GPU's
_TRACE_NAME = re.compile(rf"{TRACE_SPEC_PREFIX}-(\d+(?:\.\d+)?)-(\d+(?:\.\d+)?)w")


@dataclass(frozen=True)
class PowerSpec:
    """What a simulated GPU allows and the constants of its power model.

    Attributes:
        name: Canonical key, e.g. ``"A40"``, ``"H100-SXM"``, ``"P100-PCIe"`` (:func:`power_spec_names`), or
            ``"unlisted-<min>-<max>W"`` for a GPU outside the catalogue (:func:`trace_range_spec`).
        max_power_w: Highest (and default) power limit.
        min_power_w: Lowest settable power limit.
        idle_power_w: Board power of an idle GPU.
        max_sm_mhz: Highest supported SM clock (the boost clock).
        min_sm_mhz: Lowest supported SM clock.
        sm_clocks_mhz: Supported SM clocks in MHz, ascending (what a clock lock accepts).
        peak_flops: Peak dense FP16 tensor FLOP/s at the boost clock.
        memory_bandwidth_bps: Peak memory bandwidth in bytes per second.
        source: Where the figures come from, naming the estimates.
        static_power_w: Board power of a busy GPU that does not depend on the SM clock (idle power, memory,
            leakage): the power model's ``P_static``.
        v_floor: Core voltage at and below the knee, as a fraction of the voltage at the boost clock.
        v_knee: Clock (as a fraction of ``max_sm_mhz``) above which voltage rises linearly to its maximum.
        fitted: True when the three model constants were fitted to measured traces of this GPU.
        aliases: Other names :func:`find_power_spec` accepts (lower case).
        from_trace: True for a GPU outside the catalogue whose power-limit range came from a user's trace.
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
    from_trace: bool = False


def _clock_grid(low: int, high: int, step: float) -> tuple[int, ...]:
    """Supported clocks from ``high`` down in steps of ``step`` (rounded down to whole MHz), ascending."""
    count = int(round((high - low) / step))
    return tuple(sorted({int(math.floor(high - k * step + 1e-9)) for k in range(count + 1)}))


def _catalogue(name: str) -> GpuSpec:
    """The catalogue entry named ``name``."""
    for spec in GPUS:
        if spec.name == name:
            return spec
    raise KeyError(name)  # a bug: the catalogue lost an entry this module relies on


def _catalogue_fp16(name: str) -> float:
    """Peak FP16 tensor FLOP/s from the catalogue entry named ``name``."""
    return _catalogue(name).fp16


_UNTRACED_NOTE = ("datasheet power limits, clocks, FLOP/s and bandwidth; idle power a typical reading; "
                  "static power and V/f curve estimated (idle + 7 % of max power; mean of the fitted A40/V100 "
                  "curves)")


def _untraced(name: str, sheet: str, *, max_w: float, min_w: float, idle_w: float, clocks: tuple[int, int],
              source: str, aliases: tuple[str, ...], step: float = 15.0) -> PowerSpec:
    """The spec of a GPU without a measured trace: figures from its datasheet and catalogue entry ``sheet``,
    model constants by the module's rules (static power = idle + 7 % of the maximum, the mean V/f curve)."""
    entry = _catalogue(sheet)
    assert entry.memory_bps is not None  # every entry used here has one
    low, high = clocks
    step = (high - low) / max(1, round((high - low) / step))  # a grid from the lowest to the boost clock
    return PowerSpec(
        name=name, max_power_w=max_w, min_power_w=min_w, idle_power_w=idle_w, max_sm_mhz=high, min_sm_mhz=low,
        sm_clocks_mhz=_clock_grid(low, high, step), peak_flops=entry.fp16, memory_bandwidth_bps=entry.memory_bps,
        source=f"{source}; {_UNTRACED_NOTE}", static_power_w=float(round(idle_w + STATIC_SHARE * max_w)),
        v_floor=V_FLOOR, v_knee=V_KNEE, aliases=aliases)


PASCAL_STEP_MHZ = 12.66  # Pascal Teslas list SM clocks 12-13 MHz apart (1328, 1316, 1303, ... MHz)

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
        aliases=("v100", "v100-pcie", "v100 pcie", "tesla v100", "nvidia v100", "tesla v100-pcie-16gb",
                 "tesla v100-pcie-32gb")),
    PowerSpec(
        name="H100-SXM", max_power_w=700.0, min_power_w=200.0, idle_power_w=70.0,
        max_sm_mhz=1980, min_sm_mhz=345, sm_clocks_mhz=_clock_grid(345, 1980, 15),
        peak_flops=_catalogue_fp16("NVIDIA H100 SXM"), memory_bandwidth_bps=3350 * GIGA,
        source="NVIDIA H100 SXM5 80GB datasheet (700 W, 1980 MHz boost, 3.35 TB/s); nvidia-smi limits "
               "200-700 W; " + _UNTRACED_NOTE,
        static_power_w=119.0, v_floor=0.65, v_knee=0.60,
        aliases=("h100", "h100-sxm", "h100 sxm", "h100-sxm5", "h100 sxm5", "nvidia h100",
                 "nvidia h100 80gb hbm3")),
    PowerSpec(
        name="A100-SXM", max_power_w=400.0, min_power_w=100.0, idle_power_w=50.0,
        max_sm_mhz=1410, min_sm_mhz=210, sm_clocks_mhz=_clock_grid(210, 1410, 15),
        peak_flops=_catalogue_fp16("NVIDIA A100"), memory_bandwidth_bps=2039 * GIGA,
        source="NVIDIA A100 SXM4 80GB datasheet (400 W, 1410 MHz boost, 2.04 TB/s); nvidia-smi limits "
               "100-400 W; " + _UNTRACED_NOTE,
        static_power_w=78.0, v_floor=0.65, v_knee=0.60,
        aliases=("a100", "a100-sxm", "a100 sxm", "a100-sxm4", "a100 sxm4", "nvidia a100",
                 "nvidia a100-sxm4-80gb", "nvidia a100-sxm4-40gb")),
    PowerSpec(
        name="MI250X", max_power_w=560.0, min_power_w=200.0, idle_power_w=90.0,
        max_sm_mhz=1700, min_sm_mhz=500, sm_clocks_mhz=_clock_grid(500, 1700, 15),
        peak_flops=_catalogue_fp16("AMD Instinct MI250X"), memory_bandwidth_bps=3277 * GIGA,
        source="AMD Instinct MI250X datasheet (one OAM, both GCDs: 560 W, 1700 MHz peak engine clock, "
               "3.28 TB/s); power-cap floor 200 W and 500 MHz lowest clock are estimates; " + _UNTRACED_NOTE,
        static_power_w=129.0, v_floor=0.65, v_knee=0.60,
        aliases=("mi250x", "mi250", "amd mi250x", "instinct mi250x", "amd instinct mi250x")),
    _untraced(
        "P100-PCIe", "NVIDIA P100 PCIe", max_w=250.0, min_w=125.0, idle_w=25.0, clocks=(544, 1328),
        step=PASCAL_STEP_MHZ,
        source="NVIDIA Tesla P100 PCIe 16GB product brief (250 W, 18.7 TFLOP/s FP16 at its 1303 MHz boost, no "
               "tensor cores, 732 GB/s); nvidia-smi limits 125-250 W and clocks 544-1328 MHz about every 12.7 MHz "
               "(grid approximate)",
        aliases=("p100", "p100-pcie", "p100 pcie", "p100-pcie-16gb", "tesla p100", "tesla p100-pcie",
                 "tesla p100-pcie-16gb", "tesla p100-pcie-12gb", "nvidia p100")),
    _untraced(
        "P100-SXM2", "NVIDIA P100", max_w=300.0, min_w=150.0, idle_w=30.0, clocks=(544, 1480),
        step=PASCAL_STEP_MHZ,
        source="NVIDIA Tesla P100 SXM2 (NVLink) datasheet (300 W, 1480 MHz boost, 21.2 TFLOP/s FP16, no tensor "
               "cores, 732 GB/s); minimum limit 150 W and lowest clock 544 MHz (as on the PCIe card) are "
               "estimates, clock grid about every 12.7 MHz",
        aliases=("p100-sxm2", "p100 sxm2", "p100-sxm", "p100 sxm", "tesla p100-sxm2", "tesla p100-sxm2-16gb")),
    _untraced(
        "T4", "NVIDIA T4", max_w=70.0, min_w=60.0, idle_w=10.0, clocks=(300, 1590),
        source="NVIDIA T4 datasheet (70 W, 1590 MHz boost, 65 TFLOP/s FP16 tensor, 320 GB/s); nvidia-smi limits "
               "60-70 W, lowest clock 300 MHz",
        aliases=("t4", "tesla t4", "nvidia t4")),
    _untraced(
        "RTX6000", "NVIDIA Quadro RTX 6000", max_w=295.0, min_w=100.0, idle_w=15.0, clocks=(300, 1770),
        source="NVIDIA Quadro RTX 6000 datasheet (295 W max board power, 1770 MHz boost, 130.5 TFLOP/s FP16 "
               "tensor, 672 GB/s); minimum limit 100 W and lowest clock 300 MHz (as on the T4) are estimates",
        aliases=("rtx6000", "rtx-6000", "rtx 6000", "quadro rtx 6000", "quadro-rtx-6000", "quadro rtx6000")),
    _untraced(
        "A6000", "NVIDIA RTX A6000", max_w=300.0, min_w=100.0, idle_w=20.0, clocks=(210, 1800),
        source="NVIDIA RTX A6000 datasheet (300 W, 1800 MHz boost, 154.8 TFLOP/s dense FP16 tensor, 768 GB/s); "
               "minimum limit 100 W and lowest clock 210 MHz (as on the A40) are estimates",
        aliases=("a6000", "rtx-a6000", "rtx a6000", "nvidia rtx a6000")),
    _untraced(
        "L4", "NVIDIA L4", max_w=72.0, min_w=40.0, idle_w=16.0, clocks=(210, 2040),
        source="NVIDIA L4 datasheet (72 W, 2040 MHz boost, 121 TFLOP/s dense FP16 tensor, 300 GB/s); nvidia-smi "
               "limits 40-72 W; lowest clock 210 MHz an estimate",
        aliases=("l4", "nvidia l4")),
    _untraced(
        "L40S", "NVIDIA L40S", max_w=350.0, min_w=100.0, idle_w=35.0, clocks=(210, 2520),
        source="NVIDIA L40S datasheet (350 W, 2520 MHz boost, 362 TFLOP/s dense FP16 tensor, 864 GB/s); "
               "minimum limit 100 W and lowest clock 210 MHz are estimates",
        aliases=("l40s", "nvidia l40s")),
    _untraced(
        "A100-PCIe", "NVIDIA A100 PCIe", max_w=300.0, min_w=150.0, idle_w=40.0, clocks=(210, 1410),
        source="NVIDIA A100 PCIe 80GB datasheet (300 W, 1410 MHz boost, 312 TFLOP/s dense FP16 tensor, "
               "1.94 TB/s); nvidia-smi limits 150-300 W, clocks 210-1410 MHz",
        aliases=("a100-pcie", "a100 pcie", "a100-pcie-80gb", "a100 80gb pcie", "nvidia a100 80gb pcie")),
    _untraced(
        "H100-PCIe", "NVIDIA H100 PCIe", max_w=350.0, min_w=200.0, idle_w=50.0, clocks=(345, 1755),
        source="NVIDIA H100 PCIe 80GB datasheet (350 W, 1755 MHz boost, 756 TFLOP/s dense FP16 tensor, "
               "2.0 TB/s); nvidia-smi limits 200-350 W; lowest clock 345 MHz (as on the H100 SXM) an estimate",
        aliases=("h100-pcie", "h100 pcie", "nvidia h100 pcie")),
    _untraced(
        "H200", "NVIDIA H200", max_w=700.0, min_w=200.0, idle_w=75.0, clocks=(345, 1980),
        source="NVIDIA H200 SXM datasheet (700 W, 989 TFLOP/s dense FP16 tensor, 4.8 TB/s); clocks 345-1980 MHz "
               "and minimum limit 200 W as on the H100 SXM (same GH100 die and board power): estimates",
        aliases=("h200", "h200-sxm", "h200 sxm", "h200-sxm5", "nvidia h200", "nvidia h200-sxm-141gb")),
    _untraced(
        "B200", "NVIDIA B200", max_w=1000.0, min_w=200.0, idle_w=120.0, clocks=(345, 1980),
        source="NVIDIA HGX B200 datasheet, per GPU (1000 W, 2.25 PFLOP/s dense FP16 tensor, 8 TB/s); NVIDIA "
               "publishes no clocks: 1980 MHz boost from third-party listings, 345 MHz lowest clock, minimum "
               "limit 200 W and idle 120 W are estimates",
        aliases=("b200", "b200-sxm", "b200 sxm", "nvidia b200", "nvidia b200-sxm-180gb")),
    _untraced(
        "MI300X", "AMD Instinct MI300X", max_w=750.0, min_w=300.0, idle_w=140.0, clocks=(500, 2100),
        source="AMD Instinct MI300X datasheet (750 W, 2100 MHz peak engine clock, 1307 TFLOP/s dense FP16, "
               "5.3 TB/s); power-cap floor 300 W and 500 MHz lowest clock are estimates",
        aliases=("mi300x", "amd mi300x", "instinct mi300x", "amd instinct mi300x")),
)


def power_spec_names() -> list[str]:
    """Canonical names of every GPU in the catalogue (not the trace-range ones)."""
    return [spec.name for spec in POWER_SPECS]


def find_power_spec(name: str) -> PowerSpec:
    """The spec of a GPU by canonical name or alias, case-insensitively (an ``unlisted-<min>-<max>W`` name
    rebuilds the spec of a GPU outside the catalogue, see :func:`trace_range_spec`).

    Raises:
        ConfigError: Unknown name (the message lists the choices).
    """
    key = name.strip().lower()
    for spec in POWER_SPECS:
        if key == spec.name.lower() or key in spec.aliases:
            return spec
    found = _TRACE_NAME.fullmatch(key)
    if found:
        return trace_range_spec(float(found.group(1)), float(found.group(2)))
    raise ConfigError(f"unknown GPU model {name!r}; choose one of {', '.join(power_spec_names())}")


# Device names as nvidia-smi, NVML, CUDA or rocm-smi spell them, as words (``*``: a word starting so) that must
# all occur; the first pattern that matches wins, so parts not in the catalogue (``None``) come before the
# model they would be taken for.
_DEVICE_PATTERNS: tuple[tuple[tuple[str, ...], str | None], ...] = (
    (("gb200",), None),                   # Grace-Blackwell: 1200 W and other clocks than the HGX B200
    (("b200",), "B200"),
    (("h200", "nvl"), None),              # 600 W PCIe card
    (("h200",), "H200"),
    (("h100", "pcie"), "H100-PCIe"),
    (("h100", "nvl"), None),              # 400 W PCIe card
    (("gh200",), None),
    (("h100",), "H100-SXM"),
    (("a100", "pcie", "40gb"), None),     # 250 W PCIe card
    (("a100", "pcie"), "A100-PCIe"),
    (("a100",), "A100-SXM"),
    (("v100", "sxm*"), None),             # 300 W SXM2/SXM3 parts; the V100 spec is the 250 W PCIe card
    (("v100",), "V100"),
    (("p100", "sxm*"), "P100-SXM2"),
    (("p100",), "P100-PCIe"),
    (("a6000",), "A6000"),
    (("quadro", "rtx", "6000"), "RTX6000"),
    (("rtx6000",), "RTX6000"),
    (("l40s",), "L40S"),
    (("l4",), "L4"),
    (("t4",), "T4"),
    (("a40",), "A40"),
    (("mi300x",), "MI300X"),
    (("mi250x",), "MI250X"),
    (("mi250",), "MI250X"),
)


def _word_matches(pattern: str, words: list[str]) -> bool:
    if pattern.endswith("*"):
        return any(word.startswith(pattern[:-1]) for word in words)
    return pattern in words


def match_power_spec(device_name: str) -> PowerSpec | None:
    """The catalogued spec of a GPU as a tool names it (``"Tesla P100-PCIE-16GB"``, ``"NVIDIA A100 80GB PCIe"``,
    ``"NVIDIA L4"``, ``"T4"``), or ``None`` for a GPU the catalogue lacks (e.g. ``"Tesla V100-SXM2-32GB"``: a
    300 W part, not the 250 W PCIe card the V100 spec describes)."""
    key = device_name.strip().lower()
    for spec in POWER_SPECS:
        if key == spec.name.lower() or key in spec.aliases:
            return spec
    words = re.findall(r"[a-z0-9]+", key)
    for patterns, name in _DEVICE_PATTERNS:
        if all(_word_matches(p, words) for p in patterns):
            return None if name is None else find_power_spec(name)
    return None


def trace_range_name(min_power_w: float, max_power_w: float) -> str:
    """The name of the spec of a GPU outside the catalogue whose trace swept ``min``-``max`` W."""
    return f"{TRACE_SPEC_PREFIX}-{min_power_w:g}-{max_power_w:g}W"


@lru_cache(maxsize=64)
def trace_range_spec(min_power_w: float, max_power_w: float) -> PowerSpec:
    """The spec of a GPU outside the catalogue whose trace swept power limits from ``min`` to ``max`` W.

    The range (default limit: the maximum) is the trace's; the rest is estimated (see the module docs):
    idle 10 % of the maximum, static power idle + 7 %, the A40's clocks, FLOP/s and bandwidth, the mean V/f curve.

    Raises:
        ConfigError: Not ``0 < min < max <= 10,000`` W.
    """
    low, high = float(min_power_w), float(max_power_w)
    if not (math.isfinite(low) and math.isfinite(high) and 0 < low < high <= MAX_TRACE_POWER_W):
        raise ConfigError(f"a GPU's power-limit range must satisfy 0 < min < max <= {MAX_TRACE_POWER_W:,.0f} W, "
                          f"got {low:g}-{high:g} W")
    a40 = POWER_SPECS[0]
    idle = TRACE_IDLE_SHARE * high
    return PowerSpec(
        name=trace_range_name(low, high), max_power_w=high, min_power_w=low, idle_power_w=idle,
        max_sm_mhz=a40.max_sm_mhz, min_sm_mhz=a40.min_sm_mhz, sm_clocks_mhz=a40.sm_clocks_mhz,
        peak_flops=a40.peak_flops, memory_bandwidth_bps=a40.memory_bandwidth_bps,
        source=(f"a GPU outside the catalogue: power-limit range {low:g}-{high:g} W taken from its measured trace "
                "(lowest and highest limit swept); estimates: idle power 10 % of the maximum, static power idle + "
                "7 % of the maximum, V/f curve the mean of the fitted A40/V100 curves, and the A40's SM clocks, "
                "FLOP/s and bandwidth (SM-clock results are not meaningful)"),
        static_power_w=idle + STATIC_SHARE * high, v_floor=V_FLOOR, v_knee=V_KNEE, from_trace=True)
