"""Peak dense throughput and memory bandwidth of accelerators, from vendors' datasheets.

Figures are dense (no structured sparsity) tensor-core peaks in FLOP/s. Used as the denominator of MFU on
GPUs; on CPUs dtpo measures the peak instead (see :mod:`dtpo.session.loop.mfu`). Memory bandwidth is the datasheet's
peak (the SXM / OAM part where a GPU comes in several, unless a more specific entry names the PCIe card), for
memory-bound work such as the optimizer step. The P100 has no tensor cores: its ``fp16`` is the FP16 peak of its
CUDA cores. The B200's figures are the HGX B200's per GPU (1000 W); a GB200 (its device name contains ``b200``)
runs at more power and a higher clock than that entry says.
"""

from __future__ import annotations

from dataclasses import dataclass

TERA = 1e12


@dataclass(frozen=True)
class GpuSpec:
    """Datasheet figures of one GPU model.

    Attributes:
        name: Marketing name.
        match: Lower-case substrings that identify it in ``torch.cuda.get_device_name()`` (all must occur).
        fp32: Peak FP32 FLOP/s without TF32.
        tf32: Peak TF32 tensor FLOP/s (dense), if the GPU has TF32.
        bf16: Peak BF16 tensor FLOP/s (dense), if supported.
        fp16: Peak FP16 tensor FLOP/s (dense).
        tdp_w: Maximum board power (W).
        memory_bps: Peak memory bandwidth (bytes/s), if known.
    """

    name: str
    match: tuple[str, ...]
    fp32: float
    tf32: float | None
    bf16: float | None
    fp16: float
    tdp_w: float
    memory_bps: float | None = None


# More specific entries first: the first whose substrings all occur wins.
GPUS: tuple[GpuSpec, ...] = (
    GpuSpec("NVIDIA B200", ("b200",), 75.0 * TERA, 1125.0 * TERA, 2250.0 * TERA, 2250.0 * TERA, 1000, 8.0e12),
    GpuSpec("NVIDIA H200", ("h200",), 66.9 * TERA, 494.7 * TERA, 989.4 * TERA, 989.4 * TERA, 700, 4.8e12),
    GpuSpec("NVIDIA H100 PCIe", ("h100", "pcie"), 51.2 * TERA, 378.0 * TERA, 756.5 * TERA, 756.5 * TERA, 350, 2.0e12),
    GpuSpec("NVIDIA H100 NVL", ("h100", "nvl"), 60.0 * TERA, 417.5 * TERA, 835.0 * TERA, 835.0 * TERA, 400, 3.9e12),
    GpuSpec("NVIDIA H100 SXM", ("h100",), 66.9 * TERA, 494.7 * TERA, 989.4 * TERA, 989.4 * TERA, 700, 3.35e12),
    GpuSpec("NVIDIA A100 PCIe 40GB", ("a100", "pcie", "40gb"), 19.5 * TERA, 156.0 * TERA, 312.0 * TERA, 312.0 * TERA,
            250, 1.555e12),
    GpuSpec("NVIDIA A100 PCIe", ("a100", "pcie"), 19.5 * TERA, 156.0 * TERA, 312.0 * TERA, 312.0 * TERA, 300, 1.935e12),
    GpuSpec("NVIDIA A100", ("a100",), 19.5 * TERA, 156.0 * TERA, 312.0 * TERA, 312.0 * TERA, 400, 2.039e12),
    GpuSpec("NVIDIA L40S", ("l40s",), 91.6 * TERA, 183.0 * TERA, 362.0 * TERA, 362.0 * TERA, 350, 864e9),
    GpuSpec("NVIDIA A40", ("a40",), 37.4 * TERA, 74.8 * TERA, 149.7 * TERA, 149.7 * TERA, 300, 696e9),
    GpuSpec("NVIDIA RTX A6000", ("a6000",), 38.7 * TERA, 77.4 * TERA, 154.8 * TERA, 154.8 * TERA, 300, 768e9),
    GpuSpec("NVIDIA Quadro RTX 6000", ("quadro", "rtx", "6000"), 16.3 * TERA, None, None, 130.5 * TERA, 295, 672e9),
    GpuSpec("NVIDIA A10", ("a10",), 31.2 * TERA, 62.5 * TERA, 125.0 * TERA, 125.0 * TERA, 150, 600e9),
    GpuSpec("NVIDIA L4", ("l4",), 30.3 * TERA, 60.0 * TERA, 121.0 * TERA, 121.0 * TERA, 72, 300e9),
    GpuSpec("NVIDIA V100", ("v100",), 15.7 * TERA, None, None, 125.0 * TERA, 300, 900e9),
    GpuSpec("NVIDIA T4", ("t4",), 8.1 * TERA, None, None, 65.0 * TERA, 70, 320e9),
    GpuSpec("NVIDIA P100 PCIe", ("p100", "pcie"), 9.3 * TERA, None, None, 18.7 * TERA, 250, 732e9),
    GpuSpec("NVIDIA P100", ("p100",), 10.6 * TERA, None, None, 21.2 * TERA, 300, 732e9),
    GpuSpec("AMD Instinct MI300X", ("mi300x",), 163.4 * TERA, 653.7 * TERA, 1307.4 * TERA, 1307.4 * TERA, 750, 5.3e12),
    GpuSpec("AMD Instinct MI250X", ("mi250x",), 95.7 * TERA, None, 383.0 * TERA, 383.0 * TERA, 560, 3.2768e12),
)


def find_gpu(device_name: str) -> GpuSpec | None:
    """The catalogue entry for a device name as CUDA reports it, or ``None`` if unknown."""
    lowered = device_name.lower()
    for spec in GPUS:
        if all(part in lowered for part in spec.match):
            return spec
    return None


def gpu_peak_flops(spec: GpuSpec, dtype: str, allow_tf32: bool = False) -> float | None:
    """Peak FLOP/s of a GPU for matmuls in ``dtype`` (``"float32"``, ``"bfloat16"``, ``"float16"``)."""
    if dtype == "bfloat16":
        return spec.bf16
    if dtype == "float16":
        return spec.fp16
    if allow_tf32 and spec.tf32:
        return spec.tf32
    return spec.fp32
