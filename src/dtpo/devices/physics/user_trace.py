"""A user's own measured power-limit sweep, read from a CSV file in the shipped Zeus columns.

The file is what ``dtpo simulate --trace FILE.csv`` calibrates a simulated GPU on. Its columns are those of
the shipped Zeus files (``dtpo/devices/physics/data/zeus_nsdi23/summary_power_a40.csv``), matched by name
(case and surrounding spaces ignored, any order, extra columns ignored):

* required, one number > 0 per row: ``power_limit`` (W), ``time_per_epoch`` (s), ``average_power`` (W);
* optional, naming the workload: ``dataset``, ``network``, ``batch_size``, ``optimizer``. Rows are grouped
  into traces by (network, dataset, batch size, optimizer). A missing column, or an empty cell, takes its
  default: network ``"custom"``, dataset the file name without its extension (``my_sweep.csv`` ->
  ``"my_sweep"``), optimizer ``"unspecified"``, and batch size the one the caller gives (``batch_size=``;
  ``dtpo simulate --batch-size``), else 1 (then one simulated step is one sample; time and energy per sample
  do not depend on it);
* optional: ``samples_per_epoch``, the training samples one epoch iterates over (time per sample is
  ``time_per_epoch / samples_per_epoch``). Without it (or with the cell empty) the dataset must be one dtpo
  knows (:data:`dtpo.devices.physics.gpu_model.DATASET_SAMPLES`). One trace has one epoch size.

* optional: ``gpu``, the GPU the sweep was measured on, as a catalogue name or alias or as nvidia-smi names it
  (``P100``, ``Tesla P100-PCIE-16GB``, ``NVIDIA A100 80GB PCIe``); one value for the whole file.

Which GPU the sweep was measured on (:func:`read_trace_file`): the one the caller names (``--gpu``; it wins over
the ``gpu`` column), else the catalogued model the ``gpu`` column names
(:func:`dtpo.devices.physics.power_specs.match_power_spec`), else a GPU outside the catalogue whose power-limit
range is the lowest and highest limit in the file (:func:`dtpo.devices.physics.power_specs.trace_range_spec`),
said in one line (:attr:`TraceFile.note`). Every power limit must lie in a catalogued GPU's range: a sweep beyond
it is refused, not clamped (it was measured on another GPU, or another board of the model: clamping would drop or
move measurements). Each trace needs at least two distinct power limits. Blank lines are skipped. A bad file
raises one :class:`ConfigError` line naming the file, the row as a spreadsheet numbers it (the header is row 1)
and the column.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dtpo.core.errors import ConfigError
from dtpo.devices.physics.gpu_model import DATASET_SAMPLES
from dtpo.devices.physics.power_specs import PowerSpec, find_power_spec, match_power_spec, trace_range_spec
from dtpo.devices.physics.traces import Trace, TracePoint

REQUIRED_COLUMNS: tuple[str, ...] = ("power_limit", "time_per_epoch", "average_power")
WORKLOAD_COLUMNS: tuple[str, ...] = ("dataset", "network", "batch_size", "optimizer")
SAMPLES_COLUMN = "samples_per_epoch"
GPU_COLUMN = "gpu"
DEFAULT_NETWORK = "custom"
DEFAULT_OPTIMIZER = "unspecified"
DEFAULT_BATCH_SIZE = 1
MAX_FILE_BYTES = 64 * 1024 * 1024  # a power-limit sweep is a few hundred rows; refuse anything absurd


@dataclass
class _Group:
    """The rows of one trace while the file is read."""

    first_row: int
    points: dict[float, TracePoint] = field(default_factory=dict)
    rows: dict[float, int] = field(default_factory=dict)
    samples: int | None = None
    samples_row: int = 0


@dataclass(frozen=True)
class TraceFile:
    """A user's trace file as read: its traces and the GPU they were measured on.

    Attributes:
        traces: One trace per (network, dataset, batch size, optimizer), sorted by that key.
        spec: The GPU's power spec: a catalogued one, or one of the file's own power-limit range.
        note: How the GPU was found when the caller named none (one line, e.g. "GPU model not named ...: power-limit
            range 125-250 W taken from the trace"); ``None`` when the caller named it.
    """

    traces: tuple[Trace, ...]
    spec: PowerSpec
    note: str | None = None


@dataclass
class _GpuCell:
    """The file's ``gpu`` column: its value and the row it first appears in."""

    value: str | None = None
    row: int = 0


def _fail(name: str, row: int, column: str | None, message: str) -> ConfigError:
    where = f"{name} row {row}" + (f", column {column}" if column else "")
    return ConfigError(f"{where}: {message}")


def _read_text(path: Path, name: str) -> str:
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ConfigError(f"trace file {name} is larger than {MAX_FILE_BYTES // 2**20} MiB; "
                              "a power-limit sweep is a CSV of a few hundred rows")
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read trace file {name}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        row = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{name} row {row}: not UTF-8 text (byte 0x{data[exc.start]:02x}); "
                          "save the trace as a UTF-8 CSV") from None


def _number(name: str, row: int, column: str, text: str) -> float:
    value_text = text.strip()
    if not value_text:
        raise _fail(name, row, column, "empty; a number > 0 is needed")
    try:
        value = float(value_text)
    except ValueError:
        raise _fail(name, row, column, f"{value_text!r} is not a number") from None
    if not math.isfinite(value):
        raise _fail(name, row, column, f"{value_text!r} is not a finite number")
    if value <= 0:
        raise _fail(name, row, column, f"must be > 0, got {value:g}")
    return value


def _whole(name: str, row: int, column: str, text: str) -> int:
    value = _number(name, row, column, text)
    if not value.is_integer():
        raise _fail(name, row, column, f"must be a whole number > 0, got {text.strip()!r}")
    return int(value)


def _header(name: str, first: list[str]) -> dict[str, int]:
    columns: dict[str, int] = {}
    for index, raw in enumerate(first):
        key = raw.strip().lower()
        if not key:
            continue
        if key in columns:
            raise _fail(name, 1, key, "appears twice in the header")
        columns[key] = index
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        found = ", ".join(c.strip() for c in first if c.strip()) or "none"
        hint = ""
        if len(first) == 1 and any(sep in first[0] for sep in ";\t|"):
            hint = " (dtpo reads comma-separated values; this header looks separated by another character)"
        raise _fail(name, 1, None, f"missing column{'s' if len(missing) > 1 else ''} {', '.join(missing)}; "
                                   f"found: {found}{hint}; needed: {', '.join(REQUIRED_COLUMNS)}")
    return columns


def load_trace_file(path: str | Path, gpu: str | None, *, batch_size: int | None = None) -> list[Trace]:
    """The traces in a user's CSV of measured power limits (see the module docs for the format).

    Args:
        path: The CSV file.
        gpu: The GPU the sweep was measured on (any name or alias
            :func:`dtpo.devices.physics.power_specs.find_power_spec` accepts, e.g. ``"H100-SXM"``); ``None``:
            the file says (see :func:`read_trace_file`).
        batch_size: Batch size of rows that name none (no ``batch_size`` column, or an empty cell);
            ``None``: 1.

    Returns:
        One :class:`Trace` per (network, dataset, batch size, optimizer), sorted by that key, each with its
        points ascending by power limit, ``source`` set to ``path`` as given, and ``samples_per_epoch`` when
        the file gives it.

    Raises:
        ConfigError: Unknown GPU, or a bad file: one line naming the file, the row (header = row 1) and the
            column.
    """
    return list(read_trace_file(path, gpu, batch_size=batch_size).traces)


def read_trace_file(path: str | Path, gpu: str | None = None, *, batch_size: int | None = None) -> TraceFile:
    """A user's CSV of measured power limits: its traces and the GPU they were measured on.

    Args:
        path: The CSV file.
        gpu: The GPU the sweep was measured on (see :func:`load_trace_file`); ``None``: the catalogued model the
            file's ``gpu`` column names, else a GPU outside the catalogue whose power-limit range is the lowest and
            highest limit in the file (:attr:`TraceFile.note` says which).
        batch_size: Batch size of rows that name none; ``None``: 1.

    Raises:
        ConfigError: Unknown GPU, a power limit outside the GPU's range, or a bad file: one line naming the file,
            the row (header = row 1) and the column.
    """
    named = None if gpu is None else find_power_spec(gpu)
    path = Path(path)
    name = str(path)
    if batch_size is not None and (isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1):
        raise ConfigError(f"batch size must be a positive integer, got {batch_size!r}")
    default_batch = DEFAULT_BATCH_SIZE if batch_size is None else int(batch_size)
    text = _read_text(path, name)
    if "\x00" in text:
        row = text.count("\n", 0, text.index("\x00")) + 1
        raise ConfigError(f"{name} row {row}: not a CSV (binary data)")
    if not text.strip():
        raise _fail(name, 1, None, f"the file is empty; expected a header row with {','.join(REQUIRED_COLUMNS)} "
                                   "and one row per measured power limit")
    reader = csv.reader(io.StringIO(text, newline=""))
    groups: dict[tuple[str, str, int, str], _Group] = {}
    gpu_cell = _GpuCell()
    columns: dict[str, int] | None = None
    row = 0
    try:
        for row, cells in enumerate(reader, start=1):
            if not any(cell.strip() for cell in cells):
                if columns is None:
                    raise _fail(name, row, None, "the header row is empty; the first row must name the columns")
                continue
            if columns is None:
                columns = _header(name, cells)
                continue
            _add_row(name, row, cells, columns, groups, default_batch, path.stem)
            _add_gpu(name, row, _cell(cells, columns, GPU_COLUMN), gpu_cell)
    except csv.Error as exc:
        raise _fail(name, row + 1, None, f"not a CSV ({exc})") from None
    if not groups:
        raise _fail(name, 2, None, "no measurements below the header; one row per measured power limit is needed")
    spec, note = (named, None) if named is not None else _gpu_of_file(name, groups, gpu_cell)
    _check_range(name, spec, groups, named is not None, gpu_cell)
    return TraceFile(tuple(_traces(name, spec.name, groups)), spec, note)


def _add_gpu(name: str, row: int, value: str | None, seen: _GpuCell) -> None:
    """Note the ``gpu`` cell of a row: one GPU per file."""
    if value is None:
        return
    if seen.value is None:
        seen.value, seen.row = value, row
    elif " ".join(value.lower().split()) != " ".join(seen.value.lower().split()):
        raise _fail(name, row, GPU_COLUMN, f"{value!r} differs from {seen.value!r} in row {seen.row}; one file holds "
                                           "the sweeps of one GPU model")


def _gpu_of_file(name: str, groups: dict[tuple[str, str, int, str], _Group],
                 gpu_cell: _GpuCell) -> tuple[PowerSpec, str]:
    """The GPU of a file the caller named none for, and the line saying how it was found."""
    if gpu_cell.value is not None:
        spec = match_power_spec(gpu_cell.value)
        if spec is not None:
            return spec, f"GPU {spec.name}, as the gpu column of {name} names it ({gpu_cell.value!r})"
    limits = [limit for group in groups.values() for limit in group.points]
    spec = trace_range_spec(min(limits), max(limits))
    what = (f"GPU model {gpu_cell.value!r} (the gpu column of {name}) is not in the catalogue"
            if gpu_cell.value is not None else f"GPU model not named (no --gpu, no gpu column in {name})")
    return spec, (f"{what}: power-limit range {spec.min_power_w:g}-{spec.max_power_w:g} W taken from the trace "
                  f"(GPU {spec.name}; its idle and static power, clocks and FLOP/s are estimates)")


def _check_range(name: str, spec: PowerSpec, groups: dict[tuple[str, str, int, str], _Group], named: bool,
                 gpu_cell: _GpuCell) -> None:
    """Refuse the first row (in file order) whose power limit lies outside the GPU's range."""
    outside = [(group.rows[limit], limit) for group in groups.values() for limit in group.points
               if not spec.min_power_w - 1e-6 <= limit <= spec.max_power_w + 1e-6]
    if not outside:
        return
    row, limit = min(outside)
    hint = (f"is {spec.name} the GPU it was measured on? Leave --gpu out to take the range from the trace" if named
            else f"the GPU the file's gpu column names ({gpu_cell.value!r}); correct that column, or name the GPU "
                 "with --gpu")
    raise _fail(name, row, "power_limit", f"{limit:g} W is outside the {spec.name}'s power-limit range "
                                          f"{spec.min_power_w:g}-{spec.max_power_w:g} W ({hint})")


def _cell(cells: list[str], columns: dict[str, int], column: str) -> str | None:
    """The stripped cell of ``column`` (``None``: no such column, or the row stops before it, or it is empty)."""
    index = columns.get(column)
    if index is None or index >= len(cells):
        return None
    return cells[index].strip() or None


def _add_row(name: str, row: int, cells: list[str], columns: dict[str, int],
             groups: dict[tuple[str, str, int, str], _Group], default_batch: int, stem: str) -> None:
    width = max(columns.values()) + 1
    if len(cells) > width and any(cell.strip() for cell in cells[width:]):
        raise _fail(name, row, None, f"{len(cells)} values but the header names {width} columns")
    values = {}
    for column in REQUIRED_COLUMNS:
        index = columns[column]
        if index >= len(cells):
            raise _fail(name, row, column, "missing (the row ends early); a number > 0 is needed")
        values[column] = _number(name, row, column, cells[index])
    network = _cell(cells, columns, "network") or DEFAULT_NETWORK
    dataset = _cell(cells, columns, "dataset") or stem
    optimizer = (_cell(cells, columns, "optimizer") or DEFAULT_OPTIMIZER).lower()
    batch_text = _cell(cells, columns, "batch_size")
    batch = default_batch if batch_text is None else _whole(name, row, "batch_size", batch_text)
    samples_text = _cell(cells, columns, SAMPLES_COLUMN)
    samples = None if samples_text is None else _whole(name, row, SAMPLES_COLUMN, samples_text)
    key = (network, dataset, batch, optimizer)
    group = groups.setdefault(key, _Group(first_row=row))
    limit = values["power_limit"]
    if limit in group.points:
        raise _fail(name, row, "power_limit", f"{limit:g} W appears twice in the trace of {network}/{dataset} "
                                              f"batch {batch} {optimizer} (rows {group.rows[limit]} and {row})")
    if samples is not None:
        if group.samples is not None and samples != group.samples:
            raise _fail(name, row, SAMPLES_COLUMN, f"{samples} differs from {group.samples} in row "
                                                   f"{group.samples_row} of the same trace; one trace has one "
                                                   "epoch size")
        group.samples, group.samples_row = samples, row
    group.points[limit] = TracePoint(limit, values["time_per_epoch"], values["average_power"])
    group.rows[limit] = row


def _traces(name: str, gpu: str, groups: dict[tuple[str, str, int, str], _Group]) -> list[Trace]:
    """The traces of the grouped rows, checked in file order (the first bad trace is the one reported)."""
    for (network, dataset, batch, optimizer), group in sorted(groups.items(), key=lambda kv: kv[1].first_row):
        if len(group.points) < 2:
            raise _fail(name, group.first_row, "power_limit",
                        f"the trace of {network}/{dataset} batch {batch} {optimizer} has one power limit; "
                        "a calibrated model needs at least 2")
        if group.samples is None and dataset not in DATASET_SAMPLES:
            raise _fail(name, group.first_row, "dataset",
                        f"dtpo does not know how many samples an epoch of {dataset!r} has; add a "
                        f"{SAMPLES_COLUMN} column (training samples per epoch), or use a known dataset: "
                        f"{', '.join(DATASET_SAMPLES)}")
    return [Trace(gpu, network, dataset, batch, optimizer,
                  tuple(group.points[limit] for limit in sorted(group.points)),
                  samples_per_epoch=group.samples, source=name)
            for (network, dataset, batch, optimizer), group in sorted(groups.items())]


def _matches(trace: Trace, workload: str) -> bool:
    parts = [part.strip().lower() for part in workload.strip().split("/")]
    own = [trace.network.lower(), trace.dataset.lower(), trace.optimizer.lower()]
    return len(parts) <= 3 and parts == own[:len(parts)]


def pick_trace(traces: Sequence[Trace], workload: str | None = None, batch_size: int | None = None) -> Trace:
    """The one trace of ``traces`` (from one file) that ``workload`` and ``batch_size`` name.

    Args:
        traces: What :func:`load_trace_file` returned.
        workload: ``"network"``, ``"network/dataset"`` or ``"network/dataset/optimizer"`` (case-insensitive);
            ``None`` or empty: any.
        batch_size: A batch size in the file; ``None``: any.

    Raises:
        ConfigError: No trace matches, or several do (the message lists them and how to choose).
    """
    if not traces:
        raise ConfigError("no traces to choose from")
    source = traces[0].source or "the trace file"
    every = "; ".join(_choice(t) for t in traces)
    matching = [t for t in traces if not workload or _matches(t, workload)]
    if not matching:
        raise ConfigError(f"no trace of workload {workload!r} in {source}; it holds: {every}")
    if batch_size is not None:
        measured = ", ".join(str(b) for b in sorted({t.batch_size for t in matching}))
        matching = [t for t in matching if t.batch_size == batch_size]
        if not matching:
            what = f" of {workload}" if workload else ""
            raise ConfigError(f"no trace{what} at batch size {batch_size} in {source}; measured batch sizes: "
                              f"{measured}")
    if len(matching) > 1:
        raise ConfigError(f"{source} holds {len(matching)} traces that match; choose one with --workload "
                          f"NETWORK/DATASET/OPTIMIZER and --batch-size: {'; '.join(_choice(t) for t in matching)}")
    return matching[0]


def _choice(trace: Trace) -> str:
    """How to name a trace on the command line."""
    return f"{trace.network}/{trace.dataset}/{trace.optimizer} batch {trace.batch_size}"


def describe_trace(trace: Trace) -> str:
    """One line about a trace for listings: workload, batch, optimizer, limits and epoch size."""
    limits = trace.power_limits_w
    size = (f"{trace.samples_per_epoch:,} samples/epoch" if trace.samples_per_epoch is not None
            else f"{DATASET_SAMPLES[trace.dataset]:,} samples/epoch ({trace.dataset})")
    return (f"{trace.workload} batch {trace.batch_size} {trace.optimizer}: {len(limits)} limits "
            f"{limits[0]:g}-{limits[-1]:g} W, {size}; --workload {trace.network}/{trace.dataset}/{trace.optimizer}")
