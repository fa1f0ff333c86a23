"""RAPL backend on a fake powercap tree: zone discovery, wraparound, unreadable and vanished files."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dtpo.devices.base import DeviceError
from dtpo.devices.rapl import RaplZone, open_rapl

MAX_UJ = 262_143_328_850


def zone(root: Path, zone_id: str, name: str, energy_uj: int = 0, parent: Path | None = None) -> Path:
    path = (parent or root) / f"intel-rapl:{zone_id}"
    path.mkdir(parents=True)
    (path / "name").write_text(name + "\n")
    (path / "energy_uj").write_text(f"{energy_uj}\n")
    (path / "max_energy_range_uj").write_text(f"{MAX_UJ}\n")
    return path


def set_uj(path: Path, value: int) -> None:
    (path / "energy_uj").write_text(f"{value}\n")


@pytest.fixture
def powercap(tmp_path: Path) -> Path:
    """Two packages, each with core and dram; package 0's subzones nested, package 1's flat as in sysfs."""
    root = tmp_path / "powercap"
    root.mkdir()
    (root / "intel-rapl").mkdir()  # the control type directory: not a zone
    p0 = zone(root, "0", "package-0", 1_000_000)
    zone(root, "0:0", "core", 5, parent=p0)
    zone(root, "0:1", "dram", 2_000_000, parent=p0)
    zone(root, "1", "package-1", 3_000_000)
    zone(root, "1:0", "core", 5)
    zone(root, "1:1", "dram", 4_000_000)
    zone(root, "2", "psys", 7)
    (root / "intel-rapl-mmio:0").mkdir()  # a second view of package 0 on some laptops
    return root


def test_discovers_packages_and_dram_and_skips_the_rest(powercap: Path) -> None:
    zones = open_rapl(powercap, keeper_interval_s=None)
    assert [(z.info.name, z.info.kind) for z in zones] == [
        ("package-0", "cpu"), ("package-1", "cpu"), ("dram-0", "dram"), ("dram-1", "dram")]
    for z in zones:
        assert (z.info.source, z.info.estimated, z.info.node_shared) == ("rapl", False, True)
        assert z.info.detail == str(z.path)
    assert zones[2].path == powercap / "intel-rapl:0" / "intel-rapl:0:1"


def test_energy_advances_in_joules(powercap: Path) -> None:
    zones = {z.info.name: z for z in open_rapl(powercap, keeper_interval_s=None)}
    assert zones["package-0"].energy_j() == 0.0
    set_uj(powercap / "intel-rapl:0", 1_000_000 + 2_500_000)
    set_uj(powercap / "intel-rapl:1:1", 4_000_000 + 500_000)
    assert zones["package-0"].energy_j() == pytest.approx(2.5)
    assert zones["dram-1"].energy_j() == pytest.approx(0.5)
    assert zones["package-1"].energy_j() == 0.0


def test_wraparound_keeps_energy_rising(tmp_path: Path) -> None:
    path = zone(tmp_path, "0", "package-0", MAX_UJ - 1_000_000)
    pkg = RaplZone(path, "package-0", "cpu")
    set_uj(path, MAX_UJ - 200_000)
    assert pkg.energy_j() == pytest.approx(0.8)
    set_uj(path, 300_000)  # wrapped: 0.2 J to the top, then 0.3 J from 0
    assert pkg.energy_j() == pytest.approx(1.3)
    assert pkg.wraps == 1
    set_uj(path, 1_300_000)
    assert pkg.energy_j() == pytest.approx(2.3)
    set_uj(path, 100_000)  # a second wrap
    assert pkg.energy_j() == pytest.approx(2.3 + (MAX_UJ - 1_300_000 + 100_000) / 1e6)
    assert pkg.wraps == 2


def wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_keeper_thread_catches_a_wrap_that_rare_reads_would_miss(tmp_path: Path) -> None:
    path = zone(tmp_path, "0", "package-0", 1_000_000)
    pkg = RaplZone(path, "package-0", "cpu", keeper_interval_s=0.001)
    set_uj(path, MAX_UJ - 1_000)
    wait_for(lambda: pkg._last_uj == MAX_UJ - 1_000)
    set_uj(path, 1_500_000)  # a full lap later: read only now and then, this would look like +0.5 J
    wait_for(lambda: pkg.wraps == 1)
    assert pkg.energy_j() == pytest.approx((MAX_UJ + 500_000) / 1e6)
    pkg.close()
    assert pkg._keeper is None


def test_root_only_energy_uj_gives_one_line_with_the_fix(powercap: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_read_text = Path.read_text

    def read_text(self: Path, *args, **kwargs) -> str:
        if self.name == "energy_uj":
            raise PermissionError(13, "Permission denied", str(self))
        return real_read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    with pytest.raises(DeviceError) as exc:
        open_rapl(powercap, keeper_interval_s=None)
    message = str(exc.value)
    assert "\n" not in message
    assert "readable only by root (CVE-2020-8694)" in message
    assert f"sudo chmod o+r {powercap}/intel-rapl:*/energy_uj" in message


def test_vanished_file_raises(powercap: Path) -> None:
    zones = open_rapl(powercap, keeper_interval_s=None)
    (zones[0].path / "energy_uj").unlink()
    with pytest.raises(DeviceError, match="package-0: .*energy_uj has vanished") as exc:
        zones[0].energy_j()
    assert "\n" not in str(exc.value)


def test_garbage_reading_raises(powercap: Path) -> None:
    zones = open_rapl(powercap, keeper_interval_s=None)
    (zones[0].path / "energy_uj").write_text("\n")
    with pytest.raises(DeviceError, match="does not hold an integer"):
        zones[0].energy_j()


@pytest.mark.parametrize("make", ["missing", "empty", "only-psys"])
def test_no_zones(tmp_path: Path, make: str) -> None:
    root = tmp_path / "powercap"
    if make != "missing":
        root.mkdir()
        (root / "intel-rapl").mkdir()
    if make == "only-psys":
        zone(root, "0", "psys")
    with pytest.raises(DeviceError) as exc:
        open_rapl(root)
    message = str(exc.value)
    assert "\n" not in message
    if make == "only-psys":
        assert message == f"no RAPL package zone under {root} (only: psys)"
    else:
        assert message == f"no RAPL zones under {root} (not an Intel/AMD Linux host, or powercap not mounted)"


def test_default_keeper_runs_and_close_stops_it(powercap: Path) -> None:
    zones = open_rapl(powercap)
    assert all(z._keeper is not None and z._keeper.daemon for z in zones)
    for z in zones:
        z.close()
    assert all(z._keeper is None for z in zones)
