"""Time-varying grid signals: carbon intensity (g CO2e/kWh) or an energy price (a currency per kWh) over time.

A :class:`GridSignal` is a step function: ``values[i]`` holds from ``times[i]`` (UTC) for one ``interval_s``.
:func:`load_grid_signal` reads one from a file in any of these shapes (told apart by their content):

* a plain CSV: ``time,value`` (more value columns may be named ``forecast`` and ``actual``); a column's header may
  name its unit in brackets, ``actual [gCO2e/kWh]``, or be the unit itself, ``time,EUR/MWh``; without a unit
  the values are g CO2e/kWh. The git-scraped CSVs of the UK API (``from,intensity.forecast,intensity.actual``) read
  as they are;
* WattTime v3 ``/v3/forecast`` (``{"meta": {"units": ..., "generated_at": ...}, "data": [{"point_time", "value"}]}``,
  a forecast) or ``/v3/historical`` (the same, actual values), e.g. ``lbs_co2_per_mwh``;
* Electricity Maps v3 ``/v3/carbon-intensity/history`` (``{"zone", "history": [{"datetime", "carbonIntensity",
  "isEstimated", ...}]}``, actual values in g CO2e/kWh), or its ``forecast`` (the same with ``"forecast"``);
* the UK Carbon Intensity API (https://api.carbonintensity.org.uk): ``{"data": [{"from", "to", "intensity":
  {"forecast", "actual", "index"}}]}``, which holds both a forecast and (for the past) the actual values.

Every unit is converted to g CO2e/kWh, or to a currency per kWh. Bad input is one line (:class:`ConfigError`):
unsorted or duplicate times, an unknown unit, a value that is not a finite number >= 0, fewer than two points
(the interval is unknown). A gap (a missing interval) is bridged by holding the value before it, with a warning
naming it; :meth:`GridSignal.check_covers` refuses a signal that does not cover a job's window.

:func:`synthetic_diurnal` makes a trace with a daily cycle and noise, for tests and the benchmark.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from dtpo.core.errors import ConfigError

__all__ = ["CARBON_UNIT", "KINDS", "GridSignal", "load_grid_signal", "load_grid_signals", "parse_unit",
           "synthetic_diurnal"]

log = logging.getLogger(__name__)

CARBON_UNIT = "gCO2e/kWh"
KINDS: tuple[str, ...] = ("forecast", "actual")
GRAMS_PER_POUND = 453.59237
_CARBON_UNITS = {  # spelling (lower case, no spaces) -> factor to g CO2e/kWh
    "g/kwh": 1.0, "gco2/kwh": 1.0, "gco2e/kwh": 1.0, "gco2eq/kwh": 1.0, "kg/mwh": 1.0, "kgco2/mwh": 1.0,
    "kgco2e/mwh": 1.0, "kgco2eq/mwh": 1.0, "t/gwh": 1.0, "lbs/mwh": GRAMS_PER_POUND / 1000,
    "lbsco2/mwh": GRAMS_PER_POUND / 1000, "lbs_co2_per_mwh": GRAMS_PER_POUND / 1000, "lb/mwh": GRAMS_PER_POUND / 1000,
    "g_co2_per_kwh": 1.0, "g_co2e_per_kwh": 1.0}
_PRICE_UNIT = re.compile(r"^(?P<currency>[a-z]{3})(?:/|_per_)(?P<energy>kwh|mwh)$")
_UNIT_IN_HEADER = re.compile(r"^(?P<name>.*?)\s*[\[(](?P<unit>[^\])]+)[\])]\s*$")
UNITS_HELP = "gCO2e/kWh, kgCO2e/MWh, lbs/MWh, or a price as CUR/kWh or CUR/MWh (e.g. EUR/MWh)"
GAP_TOLERANCE = 1e-6  # seconds: two times this close to one interval apart are consecutive


@dataclass(frozen=True)
class GridSignal:
    """A grid signal over time: carbon intensity or price, each value holding for one interval.

    Attributes:
        times: Start of each interval, UTC, ascending, one ``interval_s`` apart (gaps bridged on loading).
        values: The signal in each interval, in ``unit``.
        unit: ``gCO2e/kWh``, or a currency per kWh such as ``EUR/kWh``.
        kind: ``forecast`` or ``actual``.
        source: Where it came from (a file and its shape), for the record.
        interval_s: Length of one interval in seconds.
    """

    times: tuple[datetime, ...]
    values: np.ndarray
    unit: str
    kind: str
    source: str
    interval_s: float

    @property
    def start(self) -> datetime:
        """Start of the first interval."""
        return self.times[0]

    @property
    def end(self) -> datetime:
        """End of the last interval."""
        return self.times[-1] + timedelta(seconds=self.interval_s)

    @property
    def is_carbon(self) -> bool:
        """Whether the signal is carbon intensity (else a price)."""
        return self.unit == CARBON_UNIT

    @property
    def per_kwh_name(self) -> str:
        """What a kWh costs in this signal's terms: ``g CO2e`` or the currency."""
        return "g CO2e" if self.is_carbon else self.unit.split("/")[0]

    def __len__(self) -> int:
        return len(self.times)

    def window(self, start: datetime, intervals: int) -> GridSignal:
        """The ``intervals`` intervals from ``start`` (which must be an interval's start).

        Raises:
            ConfigError: The signal does not cover them.
        """
        self.check_covers(start, intervals * self.interval_s)
        first = self.index_at(start)
        return replace(self, times=self.times[first:first + intervals], values=self.values[first:first + intervals])

    def index_at(self, when: datetime) -> int:
        """The interval holding ``when``."""
        return int((when - self.start).total_seconds() // self.interval_s)

    def check_covers(self, start: datetime, seconds: float, what: str = "the job") -> None:
        """Refuse a signal that does not cover ``seconds`` from ``start``, in one line.

        Raises:
            ConfigError: ``start`` is before the signal's start, or ``start + seconds`` after its end.
        """
        end = start + timedelta(seconds=seconds)
        if start < self.start or end > self.end + timedelta(seconds=GAP_TOLERANCE):
            raise ConfigError(f"{self.source}: the {self.kind} signal covers {_iso(self.start)} to {_iso(self.end)}, "
                              f"but {what} runs from {_iso(start)} to {_iso(end)} ({seconds / 3600:.3g} h); use a "
                              "longer signal, an earlier start or a shorter deadline")

    def like(self, other: GridSignal) -> bool:
        """Whether ``other`` has the same times, interval and unit (e.g. a forecast and its actual values)."""
        return self.times == other.times and self.interval_s == other.interval_s and self.unit == other.unit


def parse_unit(text: str) -> tuple[str, float]:
    """A unit as written in a file -> ``(unit, factor)``: values times ``factor`` are in ``unit`` (``gCO2e/kWh`` or
    ``CUR/kWh``).

    Raises:
        ConfigError: A unit dtpo does not know (the message lists the accepted forms).
    """
    key = re.sub(r"\s+", "", text.strip().lower()).replace("₂", "2")
    if key in _CARBON_UNITS:
        return CARBON_UNIT, _CARBON_UNITS[key]
    price = _PRICE_UNIT.match(key)
    if price:
        return f"{price['currency'].upper()}/kWh", 1.0 if price["energy"] == "kwh" else 1e-3
    raise ConfigError(f"unknown signal unit {text.strip()!r}; use {UNITS_HELP}")


def load_grid_signals(path: Path) -> dict[str, GridSignal]:
    """Every signal in ``path`` by kind (``forecast``, ``actual``): a UK API file or a CSV with both columns gives
    both, the others one.

    Raises:
        ConfigError: The file cannot be read, is in none of the shapes, or holds a bad signal.
    """
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise ConfigError(f"--grid-signal {path}: cannot read it ({exc.strerror or exc})") from None
    if text.lstrip().startswith(("{", "[")):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
        columns = _json_columns(path, data)
    else:
        columns = _csv_columns(path, text)
    return {kind: _signal(path, shape, kind, unit, points) for kind, (shape, unit, points) in columns.items()}


def load_grid_signal(path: Path, kind: str | None = None) -> GridSignal:
    """One signal from ``path`` (see :func:`load_grid_signals`): the ``kind`` asked for, else the actual values
    where the file has them, else its forecast.

    Raises:
        ConfigError: As :func:`load_grid_signals`, or the file has no signal of that kind.
    """
    signals = load_grid_signals(path)
    if kind is None:
        return signals.get("actual") or signals["forecast"]
    if kind not in signals:
        raise ConfigError(f"{path} has no {kind} values (it has: {', '.join(signals)})")
    return signals[kind]


def synthetic_diurnal(start: datetime, days: float, *, interval_s: float = 1800.0, mean: float = 250.0,
                      swing: float = 0.35, noise: float = 0.05, seed: int = 0, unit: str = CARBON_UNIT) -> GridSignal:
    """A synthetic trace with a daily cycle: low at night and midday (solar), high at the evening peak, with
    multiplicative noise; labelled ``synthetic`` in its source.

    Args:
        start: First interval (UTC).
        days: Length of the trace.
        interval_s: Interval length.
        mean: Mean value.
        swing: Relative amplitude of the daily cycle.
        noise: Relative noise (std) on each value.
        seed: Noise seed.
        unit: The values' unit.
    """
    count = max(2, int(round(days * 86400 / interval_s)))
    times = tuple(start + timedelta(seconds=i * interval_s) for i in range(count))
    hours = np.array([(t.hour * 3600 + t.minute * 60 + t.second) / 3600 for t in times])
    cycle = 0.7 * np.cos(2 * np.pi * (hours - 19) / 24) + 0.3 * np.cos(4 * np.pi * (hours - 7) / 24)
    rng = np.random.default_rng(seed)
    values = mean * (1 + swing * cycle) * (1 + noise * rng.standard_normal(count))
    return GridSignal(times, np.maximum(values, 0.0), unit, "actual",
                      f"synthetic diurnal (mean {mean:g}, swing {swing:g}, noise {noise:g}, seed {seed})", interval_s)


# -- reading the shapes ----------------------------------------------------------------------------------------------

Points = list[tuple[datetime, float | None]]


def _csv_columns(path: Path, text: str) -> dict[str, tuple[str, str, Points]]:
    rows = [row for row in csv.reader(text.splitlines()) if row and any(cell.strip() for cell in row)]
    if len(rows) < 2:
        raise ConfigError(f"{path}: a signal CSV needs a header (time,value) and at least two rows")
    header = [cell.strip() for cell in rows[0]]
    if header[0].lower() not in ("time", "from", "datetime", "timestamp", "point_time") or len(header) < 2:
        raise ConfigError(f"{path}: the CSV header must be time,value (optionally time,forecast,actual), "
                          f"got {','.join(header)!r}")
    columns: dict[str, tuple[str, str, Points]] = {}
    for index, cell in enumerate(header[1:], start=1):
        name, unit_text = _column_name_and_unit(cell)
        kind = "forecast" if "forecast" in name else "actual"
        if kind in columns:
            raise ConfigError(f"{path}: two {kind} columns; name them forecast and actual")
        unit, factor = parse_unit(unit_text) if unit_text else (CARBON_UNIT, 1.0)
        points: Points = []
        for number, row in enumerate(rows[1:], start=2):
            if len(row) <= index:
                raise ConfigError(f"{path} line {number}: {len(row)} columns, the header has {len(header)}")
            value = row[index].strip()
            points.append((_time(path, row[0], number), None if value == "" else _number(path, value, number) * factor))
        columns[kind] = ("CSV", unit, points)
    return columns


def _column_name_and_unit(cell: str) -> tuple[str, str | None]:
    """``actual [gCO2e/kWh]`` -> (``actual``, unit); ``EUR/MWh`` -> (``value``, unit); ``value`` -> (``value``,
    None); ``intensity.forecast`` -> (``intensity.forecast``, None)."""
    bracketed = _UNIT_IN_HEADER.match(cell)
    if bracketed:
        return bracketed["name"].strip().lower() or "value", bracketed["unit"]
    if "/" in cell or "_per_" in cell.lower():
        return "value", cell
    return cell.lower(), None


def _json_columns(path: Path, data: object) -> dict[str, tuple[str, str, Points]]:
    if isinstance(data, dict) and isinstance(data.get("history") or data.get("forecast"), list):
        shape = "Electricity Maps v3"
        entries = data.get("history") or data.get("forecast")
        kind = "actual" if "history" in data else "forecast"
        field = "carbonIntensity"
        points = [(_time(path, _get(path, e, "datetime"), i), _value(path, e.get(field), i))
                  for i, e in enumerate(_dicts(path, entries))]
        if entries and not any(field in e for e in entries):
            raise ConfigError(f"{path}: {shape} entries without {field} (only carbon intensity is read)")
        return {kind: (shape, CARBON_UNIT, points)}
    if isinstance(data, dict) and isinstance(data.get("meta"), dict) and isinstance(data.get("data"), list):
        meta = data["meta"]
        shape = "WattTime v3"
        unit, factor = parse_unit(str(meta.get("units", "")) or "(missing meta.units)")
        kind = "forecast" if "generated_at" in meta else "actual"
        points = [(_time(path, _get(path, e, "point_time"), i), _scaled(_value(path, e.get("value"), i), factor))
                  for i, e in enumerate(_dicts(path, data["data"]))]
        return {kind: (shape, unit, points)}
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        entries = _dicts(path, data["data"])
        if entries and "intensity" in entries[0]:
            shape = "UK carbon-intensity API"
            columns: dict[str, tuple[str, str, Points]] = {}
            for kind in KINDS:
                points = [(_time(path, _get(path, e, "from"), i), _value(path, (e.get("intensity") or {}).get(kind), i))
                          for i, e in enumerate(entries)]
                if any(value is not None for _, value in points):
                    columns[kind] = (shape, CARBON_UNIT, points)
            if columns:
                return columns
    raise ConfigError(f"{path}: not a signal file dtpo knows (a time,value CSV, WattTime v3, Electricity Maps v3 "
                      "history or the UK carbon-intensity API JSON)")


def _signal(path: Path, shape: str, kind: str, unit: str, points: Points) -> GridSignal:
    source = f"{path} ({shape})"
    known = [(t, v) for t, v in points if v is not None]
    if len(known) < 2:
        raise ConfigError(f"{source}: the {kind} signal has {len(known)} value(s); at least two are needed")
    times = [t for t, _ in points]
    for before, after in zip(times, times[1:], strict=False):
        if after == before:
            raise ConfigError(f"{source}: time {_iso(after)} appears twice")
        if after < before:
            raise ConfigError(f"{source}: times are not sorted ({_iso(after)} comes after {_iso(before)})")
    while points and points[-1][1] is None:  # values not published yet at the end (UK API actuals)
        points = points[:-1]
    while points and points[0][1] is None:
        points = points[1:]
    times = [t for t, _ in points]
    interval = min((b - a).total_seconds() for a, b in zip(times, times[1:], strict=False))
    grid_times: list[datetime] = []
    values: list[float] = []
    gaps: list[str] = []
    last = points[0][1]
    for index, (when, value) in enumerate(points):
        if index:
            step = (when - times[index - 1]).total_seconds() / interval
            if abs(step - round(step)) * interval > GAP_TOLERANCE:
                raise ConfigError(f"{source}: time {_iso(when)} is off the {interval:g} s grid of the signal")
            missing = int(round(step)) - 1
            if missing:
                gaps.append(f"{missing} interval(s) before {_iso(when)}")
            for k in range(missing):
                grid_times.append(times[index - 1] + timedelta(seconds=(k + 1) * interval))
                values.append(float(last))  # type: ignore[arg-type]
        if value is None:
            gaps.append(f"no value at {_iso(when)}")
            value = last
        grid_times.append(when)
        values.append(float(value))  # type: ignore[arg-type]
        last = value
    if gaps:
        log.warning("%s: %s signal has gaps, bridged by holding the value before each: %s", source, kind,
                    "; ".join(gaps[:5]) + (f" (and {len(gaps) - 5} more)" if len(gaps) > 5 else ""))
    return GridSignal(tuple(grid_times), np.array(values), unit, kind, source, interval)


def _dicts(path: Path, entries: Sequence[object]) -> list[dict]:
    if not all(isinstance(e, dict) for e in entries):
        raise ConfigError(f"{path}: expected a list of objects in the signal's data")
    return list(entries)  # type: ignore[arg-type]


def _get(path: Path, entry: dict, key: str) -> str:
    if key not in entry:
        raise ConfigError(f"{path}: an entry has no {key!r}")
    return str(entry[key])


def _time(path: Path, text: str, where: int) -> datetime:
    value = text.strip()
    try:
        when = datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value)
    except ValueError:
        raise ConfigError(f"{path} entry {where}: {value!r} is not an ISO 8601 time") from None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def _number(path: Path, text: str, where: int) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{path} line {where}: {text!r} is not a number") from None
    return _checked(path, value, where)


def _value(path: Path, value: object, where: int) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{path} entry {where}: {value!r} is not a number")
    return _checked(path, float(value), where)


def _checked(path: Path, value: float, where: int) -> float:
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{path} entry {where}: a signal value must be a finite number >= 0, got {value:g}")
    return value


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def _iso(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%MZ")
