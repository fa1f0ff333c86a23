"""A user's measured power-limit traces for the benchmarks: CSV files or folders of them, each with its GPU.

Each file is read by :func:`dtpo.devices.physics.user_trace.load_trace_file` (the Zeus columns). That reader takes
the GPU from its caller, so here the GPU of a file comes from the command line (one GPU for every file, or one per
path in order), or, where none is given, from the file's own ``gpu`` column: its rows are then split by that
column and each part read as measured on its GPU (row numbers in error messages count within that part, the header
being row 1).
"""

from __future__ import annotations

import csv
import io
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from dtpo.core.errors import ConfigError
from dtpo.devices.physics.traces import Trace
from dtpo.devices.physics.user_trace import load_trace_file

GPU_COLUMN = "gpu"


def trace_paths(path: Path) -> list[Path]:
    """``path`` itself, or the ``*.csv`` files of a folder, sorted by name."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() == ".csv" and p.is_file())
        if not files:
            raise ConfigError(f"{path}: a folder with no .csv file")
        return files
    if not path.exists():
        raise ConfigError(f"{path}: no such file or folder")
    return [path]


def _by_gpu_column(path: Path) -> list[Trace]:
    """The traces of a file whose rows name their GPU in a ``gpu`` column."""
    rows = list(csv.reader(io.StringIO(path.read_text(encoding="utf-8-sig"), newline="")))
    header = rows[0] if rows else []
    names = [cell.strip().lower() for cell in header]
    if GPU_COLUMN not in names:
        raise ConfigError(f"{path}: name the GPU it was measured on (--trace-gpu), or give it a {GPU_COLUMN!r} column")
    column = names.index(GPU_COLUMN)
    parts: dict[str, list[list[str]]] = {}
    for number, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        gpu = row[column].strip() if column < len(row) else ""
        if not gpu:
            raise ConfigError(f"{path} row {number}, column {GPU_COLUMN}: empty; name the GPU of the row")
        parts.setdefault(gpu, []).append(row)
    traces: list[Trace] = []
    with tempfile.TemporaryDirectory(prefix="dtpo-trace-") as tmp:
        for i, (gpu, part) in enumerate(sorted(parts.items())):
            folder = Path(tmp) / str(i)
            folder.mkdir()
            split = folder / path.name  # the file's own name: a trace without a dataset column is named after it
            with split.open("w", newline="", encoding="utf-8") as out:
                csv.writer(out).writerows([header, *part])
            try:
                loaded = load_trace_file(split, gpu)
            except ConfigError as exc:
                raise ConfigError(str(exc).replace(str(split), f"{path} (its {gpu} rows)")) from None
            traces.extend(replace(t, source=str(path)) for t in loaded)
    return traces


def load_user_traces(paths: Sequence[Path], gpus: Sequence[str]) -> list[Trace]:
    """The traces of every file of ``paths`` (files or folders), in order.

    Args:
        paths: CSV files, or folders of them.
        gpus: No GPU (each file's own ``gpu`` column), one GPU for every file, or one per path.

    Raises:
        ConfigError: A missing file, a file without its GPU, or a bad file (one line).
    """
    if len(gpus) > 1 and len(gpus) != len(paths):
        raise ConfigError(f"{len(gpus)} GPUs for {len(paths)} trace paths: give one for all, or one per path")
    traces: list[Trace] = []
    for i, path in enumerate(paths):
        gpu = gpus[0] if len(gpus) == 1 else gpus[i] if gpus else None
        for file in trace_paths(Path(path)):
            traces.extend(load_trace_file(file, gpu) if gpu else _by_gpu_column(file))
    return traces
