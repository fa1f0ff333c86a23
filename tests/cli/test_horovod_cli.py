"""``dtpo horovod-timeline``: the straggler table, the trace beside the timeline, one-line errors (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from horovod_timelines import Job, timeline_text
from typer.testing import CliRunner

from dtpo.cli.horovod import horovod_command
from dtpo.core.errors import DtpoError, first_line

app = typer.Typer()
app.command("horovod-timeline")(horovod_command)


@app.callback()
def _root() -> None:
    """Keep ``horovod-timeline`` a subcommand, as in ``dtpo``."""


def run_cli(*args: str) -> tuple[int, str]:
    """Exit code and output as ``dtpo`` gives them: a :class:`DtpoError` ends in one line and its exit code."""
    result = CliRunner().invoke(app, ["horovod-timeline", *args])
    if isinstance(result.exception, DtpoError):
        return result.exception.exit_code, f"dtpo: error: {first_line(str(result.exception))}"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def _timeline(folder: Path, job: Job, layout: str = "0.21", cut: int | None = None) -> Path:
    path = folder / "hvd.json"
    text = timeline_text(job, layout)
    path.write_text(text if cut is None else text[:cut])
    return path


def _rows(output: str, first: str) -> dict[str, list[str]]:
    """The rows of the table whose header begins with ``first``: first cell -> cells."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [first])
    rows = {}
    for line in lines[start + 1:]:
        cells = line.split()
        if not cells or not cells[0].isdigit():
            if rows:
                break
            continue
        rows[cells[0]] = cells[1:]
    return rows


def test_the_table_names_the_rank_that_is_always_last(tmp_path: Path) -> None:
    path = _timeline(tmp_path, Job(ranks=4, steps=6, late_ms={1: 30.0}))
    code, output = run_cli(str(path))
    assert code == 0, output
    ranks = _rows(output, "rank")
    assert set(ranks) == {"0", "1", "2", "3"}
    steps, last, share, mean, _ms = ranks["1"][:5]
    assert (steps, last, share) == ("6", "6", "100%") and 29.0 < float(mean) < 31.0
    assert all(ranks[r][1:3] == ["0", "0%"] for r in ("0", "2", "3"))
    per_step = _rows(output, "step")
    assert list(per_step) == [str(i) for i in range(6)] and all(row[1] == "1" for row in per_step.values())
    trace = tmp_path / "hvd.dtpo-trace.json"
    assert f"trace: {trace}" in output
    doc = json.loads(trace.read_text())
    assert {e["pid"] for e in doc["traceEvents"]} == {0, 1, 2, 3}
    assert sum(1 for e in doc["traceEvents"] if e["name"].startswith("step ") and e["pid"] == 1) == 6


def test_a_truncated_timeline_is_read_and_said_to_be(tmp_path: Path) -> None:
    job = Job(ranks=3, steps=4, late_ms={2: 12.0})
    text = timeline_text(job)
    path = _timeline(tmp_path, job, cut=text.rindex('"name": "NEGOTIATE_ALLREDUCE"') + 60)
    code, output = run_cli(str(path), "--out", str(tmp_path / "t.json"), "--json", str(tmp_path / "f.json"))
    assert code == 0, output
    assert "cut short" in output and "1 incomplete steps left out" in output
    assert _rows(output, "rank")["2"][:2] == ["3", "3"]
    figures = json.loads((tmp_path / "f.json").read_text())
    assert (figures["truncated"], figures["measured_steps"], figures["incomplete_steps"]) == (True, 3, 1)
    assert [r["last"] for r in figures["ranks"]] == [0, 0, 3]
    assert (tmp_path / "t.json").is_file() and not (tmp_path / "hvd.dtpo-trace.json").exists()


def test_an_unclosed_timeline_of_old_horovod_reads_like_a_closed_one(tmp_path: Path) -> None:
    code, output = run_cli(str(_timeline(tmp_path, Job(ranks=2, steps=3, late_ms={0: 8.0}), layout="0.16")))
    assert code == 0, output
    assert _rows(output, "rank")["0"][:3] == ["3", "3", "100%"]


def test_the_cache_caption_and_the_tie_threshold(tmp_path: Path) -> None:
    path = _timeline(tmp_path, Job(ranks=2, steps=3, late_ms={1: 0.5}, cycle_ms=0.001, cached_from_step=2))
    code, output = run_cli(str(path))
    assert code == 0 and "1 steps negotiated by Horovod's response cache" in output
    assert _rows(output, "rank")["1"][:2] == ["2", "0"]  # 0.5 ms behind: within the default 1 ms, a tie
    code, output = run_cli(str(path), "--tie-ms", "0.1")
    assert code == 0 and _rows(output, "rank")["1"][:2] == ["2", "2"]


@pytest.mark.parametrize(("make", "args", "message"), [
    (None, [], "does not exist"),
    ("not json", [], "is not JSON"),
    ('{"traceEvents": []}', [], "holds no trace events"),
    ('[{"name": "step 0", "ph": "X", "pid": 0, "ts": 0, "dur": 1}]', [], "has no NEGOTIATE_"),
    ("cached", [], "HOROVOD_CACHE_CAPACITY=0"),
    ("ok", ["--op", "allgather"], "--op ALLGATHER: the timeline negotiates no ALLGATHER"),
    ("ok", ["--tie-ms", "-1"], "--tie-ms must be"),
    ("ok", ["--out", "{tmp}"], "is a directory"),
    ("ok", ["--json", "{tmp}/nowhere/f.json"], "does not exist"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, make: str | None, args: list[str], message: str) -> None:
    path = tmp_path / "hvd.json"
    if make == "ok":
        path.write_text(timeline_text(Job(ranks=2, steps=2)))
    elif make == "cached":
        path.write_text(timeline_text(Job(ranks=2, steps=2, cached_from_step=0)))
    elif make is not None:
        path.write_text(make)
    code, output = run_cli(str(path), *(a.replace("{tmp}", str(tmp_path)) for a in args))
    assert code == 2 and output.startswith("dtpo: error: ") and message in output and "\n" not in output
    assert not (tmp_path / "hvd.dtpo-trace.json").exists()


def test_the_real_entry_point_prints_one_line_without_a_traceback(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Through ``dtpo.cli.app.main`` where the command is registered there; else the same error by hand."""
    from dtpo.cli import app as cli_app

    if "horovod-timeline" not in {c.name for c in cli_app.app.registered_commands}:
        pytest.skip("dtpo horovod-timeline is not registered in dtpo.cli.app yet")
    with pytest.raises(SystemExit) as exited:
        cli_app.main(["horovod-timeline", str(tmp_path / "missing.json")])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err and "does not exist" in err
