"""What ``dtpo report`` reads: a train run, a bench, a plan or a simulation, as plain data.

Each input is a directory (or the JSON file in it) that dtpo wrote:

* a train run: ``record.json`` (a :class:`~dtpo.core.record.RunRecord`) and the ranks' power timelines
  ``ranks/power-rankNNNNN.csv`` (``ranks/attempt-N/`` for a restarted run's attempt N);
* a bench: ``bench.json`` (schema in :mod:`dtpo.telemetry.scaling`) and one train run per worker count in
  ``workers-N/``;
* a plan: ``plan.json``, ``{"plans": [...]}`` as ``dtpo plan --json`` writes it;
* a simulation: ``simulate.json`` as ``dtpo simulate --json`` writes it.

:func:`load_input` tells them apart and loads one; a path that is none of them is a
:class:`~dtpo.core.errors.ConfigError` in one line.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dtpo.core.errors import ConfigError, DtpoError
from dtpo.core.record import RECORD_FILE, RunRecord
from dtpo.telemetry.trace import TIMELINE_START, power_timeline_path, read_power_timeline

log = logging.getLogger(__name__)

BENCH_FILE = "bench.json"
PLAN_FILE = "plan.json"
SIMULATE_FILE = "simulate.json"
KIND_FILES = {"run": RECORD_FILE, "bench": BENCH_FILE, "plan": PLAN_FILE, "simulate": SIMULATE_FILE}


@dataclass
class PowerTimeline:
    """One rank's power timeline.

    Attributes:
        rank: The rank that sampled it.
        t_s: Seconds from the first sample.
        watts: Watts per device, one value per sample (NaN where the device gave no reading).
        started_at: Unix time of the first sample, if recorded (aligns the timeline with the steps).
        estimated: Devices whose power is modelled rather than read from a counter.
    """

    rank: int
    t_s: list[float]
    watts: dict[str, list[float]]
    started_at: float | None = None
    estimated: set[str] = field(default_factory=set)


@dataclass
class RunData:
    """A train run: its record and power timelines.

    Attributes:
        path: The run directory.
        record: The run record.
        power: Power timelines of the ranks that wrote one, ordered by rank.
    """

    path: Path
    record: RunRecord
    power: list[PowerTimeline] = field(default_factory=list)
    kind: str = "run"

    @property
    def label(self) -> str:
        """What the report calls the run."""
        return self.record.run_id or self.path.name


@dataclass
class BenchData:
    """A bench: its scaling rows and the train run of every worker count that could be read.

    Attributes:
        path: The bench directory.
        bench: The content of ``bench.json``.
        runs: Train runs by worker count.
    """

    path: Path
    bench: dict[str, Any]
    runs: dict[int, RunData] = field(default_factory=dict)
    kind: str = "bench"

    @property
    def label(self) -> str:
        """What the report calls the bench."""
        return self.path.name


@dataclass
class PlanData:
    """A plan: one dict per inter-node link (``dtpo.plan.report.plan_dict``), every figure a model prediction.

    Attributes:
        path: The file it was read from.
        plans: The plans.
    """

    path: Path
    plans: list[dict[str, Any]]
    kind: str = "plan"

    @property
    def label(self) -> str:
        """What the report calls the plan (its directory's name, or the file's stem outside a plan directory)."""
        return self.path.parent.name if self.path.name == PLAN_FILE else self.path.stem


@dataclass
class SimulateData:
    """A simulation's JSON output (every figure simulated).

    Attributes:
        path: The file it was read from.
        data: Its content.
    """

    path: Path
    data: dict[str, Any]
    kind: str = "simulate"

    @property
    def label(self) -> str:
        """What the report calls the simulation."""
        return self.path.parent.name if self.path.name == SIMULATE_FILE else self.path.stem


ReportInput = RunData | BenchData | PlanData | SimulateData


def detect_kind(path: Path) -> tuple[str, Path]:
    """Which kind of dtpo output ``path`` is, and the file that says so.

    Raises:
        ConfigError: ``path`` does not exist or is not a dtpo run, bench, plan or simulation.
    """
    if not path.exists():
        raise ConfigError(f"{path} does not exist")
    if path.is_dir():
        for kind, name in KIND_FILES.items():
            if (path / name).is_file():
                return kind, path / name
        partial = "; it has partial rank records only (the run is still going or ended before its record was " \
                  "written)" if any((path / "ranks").glob("rank*.json")) else ""
        raise ConfigError(f"{path} is not a dtpo run directory (no {', '.join(KIND_FILES.values())}){partial}")
    for kind, name in KIND_FILES.items():
        if path.name == name:
            return kind, path
    data = _read_json(path)
    schema = str(data.get("schema", ""))
    if schema.startswith("dtpo.run/"):
        return "run", path
    if schema.startswith("dtpo.bench/"):
        return "bench", path
    if schema.startswith("dtpo.simulate/"):
        return "simulate", path
    if isinstance(data.get("plans"), list):
        return "plan", path
    raise ConfigError(f"{path} is not a dtpo run record, bench, plan or simulation (no known schema)")


def load_input(path: Path) -> ReportInput:
    """Read one input of the report.

    Raises:
        ConfigError: Not a dtpo output, unreadable, or not valid.
    """
    path = Path(path)
    kind, file = detect_kind(path)
    if kind == "run":
        return load_run(file.parent if file.name == RECORD_FILE else file)
    data = _read_json(file)
    if kind == "bench":
        if not isinstance(data.get("rows"), list):
            raise ConfigError(f"{file} is not a dtpo bench record (no rows)")
        runs: dict[int, RunData] = {}
        for row in data["rows"]:
            sub = file.parent / f"workers-{row.get('workers')}"
            if (sub / RECORD_FILE).is_file():
                try:
                    runs[int(row["workers"])] = load_run(sub)
                except DtpoError as exc:
                    log.warning("report: %s is unreadable (%s); the bench shows its row only", sub, exc)
        return BenchData(file.parent, data, runs)
    if kind == "plan":
        plans = data.get("plans")
        if not isinstance(plans, list) or not all(isinstance(p, dict) and isinstance(p.get("predictions"), list)
                                                  for p in plans):
            raise ConfigError(f"{file} is not a dtpo plan (expected {{\"plans\": [...]}} with predictions)")
        return PlanData(file, plans)
    return SimulateData(file, data)


def load_run(run_dir: Path) -> RunData:
    """A train run's record and the power timelines beside it (an unreadable timeline is skipped with a warning).

    Raises:
        ConfigError: No readable record.
    """
    try:
        record = RunRecord.load(run_dir)
    except DtpoError as exc:
        raise ConfigError(str(exc)) from None
    base = run_dir if run_dir.is_dir() else run_dir.parent
    power = []
    for rank in record.ranks:
        path = power_timeline_path(base, rank.rank, record.attempt)
        if not path.is_file():
            continue
        try:
            rows = read_power_timeline(path)
        except (OSError, ValueError, KeyError) as exc:
            log.warning("report: power timeline %s is unreadable (%s); skipped", path, exc)
            continue
        if rows:
            power.append(_timeline(rank.rank, rows, rank.energy or {}))
    return RunData(base, record, power)


def _timeline(rank: int, rows: list[dict[str, float]], energy: dict[str, Any]) -> PowerTimeline:
    devices = sorted({k for row in rows for k in row} - {"t_s"})
    estimated = {d.get("name", "") for d in energy.get("devices") or [] if d.get("estimated")}
    estimated |= {d for d in devices if "modelled" in d}
    return PowerTimeline(rank=rank, t_s=[row["t_s"] for row in rows],
                         watts={d: [row.get(d, math.nan) for row in rows] for d in devices},
                         started_at=energy.get(TIMELINE_START), estimated=estimated & set(devices))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a dtpo JSON file (not text)") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path} ({exc.strerror or exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a dtpo JSON file (not an object)")
    return data

