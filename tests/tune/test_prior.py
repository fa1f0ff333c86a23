"""The power spec a tuner's model uses, found from the names GPUs go by."""

from __future__ import annotations

import pytest

from dtpo.tune.prior import spec_for


@pytest.mark.parametrize("name, spec", [
    ("gpu0 (NVIDIA A40)", "A40"),  # dtpo's own device name: the dry-run model figure looks it up so
    ("gpu3 (Tesla V100-PCIE-32GB)", "V100"),
    ("NVIDIA H100 80GB HBM3", "H100-SXM"),
    ("NVIDIA A100-SXM4-80GB", "A100-SXM"),
    ("gpu1 (NVIDIA H100 PCIe)", "H100-PCIe"),  # not the SXM part's 700 W
])
def test_nvml_and_device_names_find_their_spec(name: str, spec: str) -> None:
    found = spec_for(name)
    assert found is not None and found.name == spec


def test_an_unknown_gpu_has_no_spec() -> None:
    assert spec_for("gpu0 (Matrox G200)") is None
    assert spec_for("NVIDIA H100 NVL") is None  # a 400 W part the catalogue lacks: no borrowed SXM figures
