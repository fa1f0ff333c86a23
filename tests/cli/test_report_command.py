"""``dtpo report``: where the report goes, and one-line errors (exit 2) for paths it cannot use."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from dtpo.cli.report import report_command
from dtpo.core.errors import DtpoError, first_line
from dtpo.core.record import RankRecord, RunRecord, StepRecord

app = typer.Typer()
app.command("report")(report_command)


@app.callback()
def _root() -> None:
    """Keep ``report`` a subcommand, as in ``dtpo``."""


def run_cli(*args: str) -> tuple[int, str]:
    """Exit code and output as ``dtpo`` gives them: a :class:`DtpoError` ends in one line and its exit code."""
    result = CliRunner().invoke(app, list(args))
    if isinstance(result.exception, DtpoError):
        return result.exception.exit_code, f"dtpo: error: {first_line(str(result.exception))}"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def make_run(folder: Path) -> Path:
    steps = [StepRecord(step=i, warmup=i == 0, samples=4, step_s=0.05, data_wait_s=0.01, compute_s=0.03,
                        tail_s=None, optimizer_s=0.01) for i in range(3)]
    RunRecord(run_id=folder.name, status="completed", started_at="now",
              ranks=[RankRecord(0, 0, "host", "cpu", steps=steps)]).save(folder)
    return folder


def test_one_run_gets_its_report_beside_it(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    code, output = run_cli("report", str(run))
    assert code == 0 and output.strip() == f"report: {run / 'report.html'}"
    assert (run / "report.html").read_text().startswith("<!DOCTYPE html>")


def test_several_runs_go_to_the_current_directory_or_to_out(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b")
    monkeypatch.chdir(tmp_path)
    assert run_cli("report", str(a), str(b)) == (0, "report: report.html\n")
    assert 'id="comparison"' in (tmp_path / "report.html").read_text()
    code, _ = run_cli("report", str(a), "--out", str(tmp_path / "mine.html"))
    assert code == 0 and (tmp_path / "mine.html").is_file()


@pytest.mark.parametrize(("args", "message"), [
    (["{tmp}/missing"], "does not exist"),
    (["{tmp}/empty"], "is not a dtpo run directory"),
    (["{run}", "--out", "{tmp}"], "is a directory"),
    (["{run}", "--out", "{tmp}/nowhere/r.html"], "does not exist"),
    (["{run}", "--out", "{run}/record.json/r.html"], "is not a directory"),
], ids=["missing", "not a run", "out is a directory", "out folder missing", "out under a file"])
def test_bad_paths_end_in_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    run = make_run(tmp_path / "run")
    (tmp_path / "empty").mkdir()
    before = sorted(tmp_path.rglob("*"))
    code, output = run_cli("report", *(a.format(tmp=tmp_path, run=run) for a in args))
    assert code == 2 and message in output and "\n" not in output
    assert sorted(tmp_path.rglob("*")) == before  # nothing written
