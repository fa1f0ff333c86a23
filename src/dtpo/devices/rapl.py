"""CPU packages and DRAM through Linux powercap RAPL (``/sys/class/powercap/intel-rapl:*``).

Zones opened: every ``intel-rapl:N`` whose ``name`` is ``package-N`` (or ``package-N-die-M``), as a ``cpu``
device, and its subzone ``intel-rapl:N:M`` named ``dram``, as a ``dram`` device. Skipped, because counting them
as well would count energy twice: ``core`` and ``uncore`` (inside their package), ``psys`` (the whole
platform, packages included) and ``intel-rapl-mmio:*`` (a second view of the same package on some laptops).
AMD processors (Zen, Linux 5.8 and later) appear under the same ``intel-rapl`` names, with packages only.
Both layouts are read: subzones listed next to their package (as in ``/sys/class/powercap``) or inside it.

Wraparound: ``energy_uj`` counts up to ``max_energy_range_uj`` and then starts again from 0. A wrap can only be
seen if the counter is read at least once per wrap period, ``max_energy_range_uj / power``: about 11 minutes
for the common 262 kJ range at 400 W, under 3 minutes for a 65 kJ range at 400 W. Every read
(:meth:`RaplZone.energy_j`, :meth:`RaplZone.poll`) accounts for a wrap. The monitor's sampler reads far more
often than that; for use without it, each zone can run a *keeper* thread that calls :meth:`RaplZone.poll` every
``keeper_interval_s`` (:func:`open_rapl` starts one every 10 s by default).

Permissions: since Linux 5.10 ``energy_uj`` is readable only by root (CVE-2020-8694, "Platypus").
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

from dtpo.devices.base import Device, DeviceError, DeviceInfo, DeviceKind

DEFAULT_ROOT = Path("/sys/class/powercap")
DEFAULT_KEEPER_INTERVAL_S = 10.0
_ZONE = re.compile(r"intel-rapl:(\d+)")
_SUBZONE = re.compile(r"intel-rapl:(\d+):(\d+)")


def _read_int(path: Path) -> int:
    return int(path.read_text().strip())


def _root_of(path: Path) -> Path:
    """The powercap directory above a zone's file (for the chmod hint)."""
    for parent in path.parents:
        if not parent.name.startswith("intel-rapl"):
            return parent
    return path.parent


def _unreadable(path: Path, exc: Exception, who: str = "") -> DeviceError:
    """One line for a file of a zone that could not be read."""
    prefix = f"{who}: " if who else ""
    if isinstance(exc, PermissionError):
        return DeviceError(f"{prefix}{path} is readable only by root (CVE-2020-8694); run as root or "
                           f"`sudo chmod o+r {_root_of(path)}/intel-rapl:*/energy_uj`")
    if isinstance(exc, FileNotFoundError):
        return DeviceError(f"{prefix}{path} has vanished (was the RAPL driver unloaded?)")
    if isinstance(exc, ValueError):
        return DeviceError(f"{prefix}{path} does not hold an integer")
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return DeviceError(f"{prefix}cannot read {path}: {reason}")


class RaplZone(Device):
    """One RAPL zone (a CPU package or its DRAM), with wraparound of its counter accounted for.

    Args:
        path: The zone's directory, e.g. ``/sys/class/powercap/intel-rapl:0``.
        name: Device name, e.g. ``"package-0"`` or ``"dram-0"``.
        kind: ``"cpu"`` for a package, ``"dram"`` for DRAM.
        keeper_interval_s: If set, a daemon thread calls :meth:`poll` this often, so that no wrap is missed
            however rarely :meth:`energy_j` is called. Must be well under the wrap period (see the module doc).

    Attributes:
        path: The zone's directory.
        max_energy_range_uj: Where the counter wraps.
        wraps: Wraps seen so far.
        keeper_errors: Failed reads of the keeper thread (a failure persists into the next :meth:`energy_j`).

    Raises:
        DeviceError: A file of the zone cannot be read (one line, with the fix for the root-only case).
    """

    def __init__(self, path: Path, name: str, kind: DeviceKind, keeper_interval_s: float | None = None) -> None:
        self.path = Path(path)
        self._energy_file = self.path / "energy_uj"
        self.max_energy_range_uj = self._read(self.path / "max_energy_range_uj", name)
        if self.max_energy_range_uj <= 0:
            raise DeviceError(f"{name}: {self.path / 'max_energy_range_uj'} is {self.max_energy_range_uj}; "
                              "cannot account for wraparound")
        self._last_uj = self._read(self._energy_file, name)
        self._total_uj = 0
        self.wraps = 0
        self.keeper_errors = 0
        self._lock = threading.Lock()
        self.info = DeviceInfo(name=name, kind=kind, source="rapl", estimated=False, node_shared=True,
                               detail=str(self.path))
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None
        if keeper_interval_s is not None:
            if not keeper_interval_s > 0:
                raise ValueError(f"keeper interval must be positive, got {keeper_interval_s!r}")
            self._keeper = threading.Thread(target=self._keep, args=(keeper_interval_s,), daemon=True,
                                            name=f"dtpo-rapl-{name}")
            self._keeper.start()

    @staticmethod
    def _read(path: Path, who: str) -> int:
        try:
            return _read_int(path)
        except (OSError, ValueError) as exc:
            raise _unreadable(path, exc, who) from None

    def poll(self) -> float:
        """Read the counter now and fold in the energy since the previous read, wraps included.

        Returns:
            Joules since the zone was opened.

        Raises:
            DeviceError: ``energy_uj`` could not be read (vanished, permission, garbage).
        """
        with self._lock:
            now = self._read(self._energy_file, self.info.name)
            if now >= self._last_uj:
                self._total_uj += now - self._last_uj
            else:  # the counter passed max_energy_range_uj and restarted from 0
                self._total_uj += self.max_energy_range_uj - self._last_uj + now
                self.wraps += 1
            self._last_uj = now
            return self._total_uj / 1e6

    def energy_j(self) -> float:
        """Joules since opening (reads the counter, so it also keeps wraparound accounted for)."""
        return self.poll()

    def _keep(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.poll()
            except DeviceError:
                self.keeper_errors += 1  # energy_j raises the same error to its caller; nothing is lost here

    def close(self) -> None:
        """Stop the keeper thread, if any."""
        self._stop.set()
        if self._keeper is not None:
            self._keeper.join(timeout=5)
            self._keeper = None


def _zone_name(path: Path) -> str:
    try:
        return path.joinpath("name").read_text().strip()
    except OSError as exc:
        raise _unreadable(path / "name", exc) from None


def _index(path: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in path.name.split(":")[1:])


def open_rapl(root: Path | str = DEFAULT_ROOT,
              keeper_interval_s: float | None = DEFAULT_KEEPER_INTERVAL_S) -> list[RaplZone]:
    """Open every RAPL package zone under ``root`` and its DRAM subzone.

    Args:
        root: The powercap directory (tests pass a fake tree).
        keeper_interval_s: Period of each zone's keeper thread (``None``: no thread; then read each zone at
            least once per wrap period yourself).

    Returns:
        Packages (kind ``cpu``) followed by their DRAM (kind ``dram``), in zone order.

    Raises:
        DeviceError: With one line: no zones, no package zone, or a zone unreadable (e.g. root-only).
    """
    root = Path(root)
    try:
        entries = list(root.iterdir()) if root.is_dir() else []
    except OSError:
        entries = []
    tops = sorted((p for p in entries if _ZONE.fullmatch(p.name)), key=_index)
    if not tops:
        raise DeviceError(f"no RAPL zones under {root} (not an Intel/AMD Linux host, or powercap not mounted)")
    found: list[tuple[Path, str, DeviceKind]] = []
    names: set[str] = set()
    for top in tops:
        package = _zone_name(top)
        if not package.startswith("package"):
            continue  # psys: the whole platform, packages included
        package = package if package not in names else f"{package} ({top.name})"
        names.add(package)
        found.append((top, package, "cpu"))
        number = top.name.split(":", 1)[1]
        subs = {p.name: p for base in (root, top) for p in base.glob(f"intel-rapl:{number}:*")
                if _SUBZONE.fullmatch(p.name)}
        for sub in sorted(subs.values(), key=_index):
            if _zone_name(sub) != "dram":
                continue  # core, uncore: already inside the package
            dram = "dram" + package.removeprefix("package") if package.startswith("package-") else f"{package}-dram"
            dram = dram if dram not in names else f"{dram} ({sub.name})"
            names.add(dram)
            found.append((sub, dram, "dram"))
    if not found:
        raise DeviceError(f"no RAPL package zone under {root} (only: "
                          + ", ".join(_zone_name(t) for t in tops) + ")")
    zones: list[RaplZone] = []
    try:
        for path, name, kind in sorted(found, key=lambda z: z[2] == "dram"):
            zones.append(RaplZone(path, name, kind, keeper_interval_s))
    except DeviceError:
        for zone in zones:
            zone.close()
        raise
    return zones
