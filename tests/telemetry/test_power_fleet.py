"""Fleet figures: coherent and incoherent bounds and the correlation between them; the grid spec file and its
verdicts (a check the timeline cannot support is not judged)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from dtpo.core.errors import ConfigError
from dtpo.telemetry.power_fleet import fleet_figures, fleet_scale, judge, read_spec
from dtpo.telemetry.power_swing import PowerSeries, analyse


def square_gpu(fs_hz: float = 50.0, seconds: float = 60.0, low: float = 200.0, high: float = 700.0,
               averaging_s: float = 0.0):
    t = np.arange(int(seconds * fs_hz)) / fs_hz
    w = np.where((t * 0.5) % 1.0 < 0.6, high, low)
    return analyse(PowerSeries("gpu", t, w, averaging_s=averaging_s), step_rate_hz=0.5)


def test_fleet_scale_runs_from_sqrt_n_to_n() -> None:
    assert fleet_scale(100, 0.0) == pytest.approx(10.0)
    assert fleet_scale(100, 1.0) == pytest.approx(100.0)
    assert 10.0 < fleet_scale(100, 0.5) < 100.0
    assert fleet_scale(100, -0.3) == pytest.approx(10.0)  # anti-correlation is not extrapolated below sqrt(N)


def test_fleet_figures_in_mw_with_their_bounds() -> None:
    gpu = square_gpu()
    fleet = fleet_figures([gpu], correlation=0.9, gpus=10_000)
    low, expected, high = fleet.swing_mw
    assert high == pytest.approx(500.0 * 10_000 / 1e6)  # 5 MW in phase
    assert low == pytest.approx(500.0 * 100 / 1e6)
    assert low < expected < high and expected == pytest.approx(high * math.sqrt(0.9), rel=0.01)
    assert fleet.mean_mw == pytest.approx(gpu.mean_w * 10_000 / 1e6)
    ramp = fleet.ramps_mw_per_s[1.0]
    assert ramp is not None and ramp[2] == pytest.approx(500.0 * 10_000 / 1e6)
    assert fleet.measured_correlation


def test_one_gpu_is_taken_as_in_phase_and_says_so() -> None:
    fleet = fleet_figures([square_gpu()], correlation=None, gpus=64)
    assert fleet.correlation == 1.0 and not fleet.measured_correlation
    assert fleet.swing_mw[1] == pytest.approx(fleet.swing_mw[2])


def test_a_bad_fleet_size_is_one_line() -> None:
    with pytest.raises(ConfigError, match="fleet size"):
        fleet_figures([square_gpu()], 1.0, 0)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_spec_judges_the_band_share_and_the_ramp(tmp_path: Path) -> None:
    gpu = square_gpu()
    fleet = fleet_figures([gpu], 1.0, 1000)  # 0.5 MW swing within a fraction of a second
    strict = read_spec(write(tmp_path, "strict.toml", "band_hz = [0.1, 20.0]\nmax_band_share = 0.1\n"
                                                      "max_ramp_mw_per_s = 0.1\n"))
    verdicts = judge(strict, gpu, fleet)
    assert [v.status for v in verdicts] == ["fail", "fail"]
    loose = read_spec(write(tmp_path, "loose.json", '{"band_hz": [0.1, 20], "max_band_share": 1.0, '
                                                     '"max_ramp_mw_per_s": 1000}'))
    assert [v.status for v in judge(loose, gpu, fleet)] == ["pass", "pass"]


def test_what_the_timeline_cannot_see_is_not_judged(tmp_path: Path) -> None:
    gpu = square_gpu(fs_hz=10.0, averaging_s=1.0)  # NVML's 1 s average
    spec = read_spec(write(tmp_path, "spec.toml", "band_hz = [0.1, 20.0]\nmax_band_share = 1.0\n"
                                                  "max_ramp_mw_per_s = 1e9\nramp_lag_s = 0.1\n"))
    verdicts = judge(spec, gpu, fleet_figures([gpu], 1.0, 8))
    assert [v.status for v in verdicts] == ["not judged", "not judged"]
    assert "resolves" in verdicts[0].why


@pytest.mark.parametrize(("text", "message"), [
    ("band_hz = [20.0, 0.1]\nmax_band_share = 0.1\nmax_ramp_mw_per_s = 1\n", "band_hz"),
    ("band_hz = [0.1, 20.0]\nmax_band_share = 2\nmax_ramp_mw_per_s = 1\n", "max_band_share"),
    ("band_hz = [0.1, 20.0]\nmax_band_share = 0.1\n", "max_ramp_mw_per_s is missing"),
    ("band_hz = [0.1, 20.0]\nmax_band_share = 0.1\nmax_ramp_mw_per_s = 1\nramp_lag_s = 0.5\n", "ramp_lag_s"),
    ("band_hz = [0.1, 20.0]\nmax_band_share = 0.1\nmax_ramp_mw_per_s = 1\nband = 3\n", "unknown key"),
    ("band_hz = [0.1, 20.0]\nmax_band_share = 0.1\nmax_ramp_mw_per_s = 1\ngpus = true\n", "gpus"),
    ("band_hz = [0.1, 20.0\n", "not valid TOML"),
], ids=["band order", "share above 1", "missing ramp", "bad lag", "unknown key", "bool gpus", "not toml"])
def test_a_bad_spec_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        read_spec(write(tmp_path, "spec.toml", text))
    assert "\n" not in str(info.value)


def test_a_missing_or_non_json_spec_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        read_spec(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="not valid JSON"):
        read_spec(write(tmp_path, "spec.json", "{nope"))
