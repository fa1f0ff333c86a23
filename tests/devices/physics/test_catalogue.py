"""The GPU catalogue recognises device names as CUDA reports them."""

from __future__ import annotations

import pytest

from dtpo.devices.physics.catalogue import find_gpu, gpu_peak_flops


@pytest.mark.parametrize("name, expected", [
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
    ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"),
    ("NVIDIA H200", "NVIDIA H200"),
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100"),
    ("NVIDIA A40", "NVIDIA A40"),
    ("Tesla V100-SXM2-32GB", "NVIDIA V100"),
    ("Tesla P100-PCIE-16GB", "NVIDIA P100 PCIe"),
    ("Tesla P100-SXM2-16GB", "NVIDIA P100"),
    ("NVIDIA A100 80GB PCIe", "NVIDIA A100 PCIe"),
    ("NVIDIA A100-PCIE-40GB", "NVIDIA A100 PCIe 40GB"),
    ("NVIDIA B200", "NVIDIA B200"),
    ("Quadro RTX 6000", "NVIDIA Quadro RTX 6000"),
    ("NVIDIA RTX A6000", "NVIDIA RTX A6000"),
    ("NVIDIA L4", "NVIDIA L4"),
    ("NVIDIA L40S", "NVIDIA L40S"),
])
def test_known_names(name: str, expected: str) -> None:
    spec = find_gpu(name)
    assert spec is not None and spec.name == expected


def test_unknown_name_and_dtype_choice() -> None:
    assert find_gpu("Matrox G200") is None
    assert find_gpu("NVIDIA RTX 6000 Ada Generation") is None  # not the Quadro RTX 6000 (Turing)
    h100 = find_gpu("NVIDIA H100 80GB HBM3")
    assert h100 is not None
    assert gpu_peak_flops(h100, "bfloat16") == pytest.approx(989.4e12)
    assert gpu_peak_flops(h100, "float32") == pytest.approx(66.9e12)
    assert gpu_peak_flops(h100, "float32", allow_tf32=True) == pytest.approx(494.7e12)
    v100 = find_gpu("Tesla V100-SXM2-16GB")
    assert v100 is not None and gpu_peak_flops(v100, "bfloat16") is None
