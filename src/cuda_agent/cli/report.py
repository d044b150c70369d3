"""`report`: results as one self-contained page; `report DB --list`: the runs a suite database holds."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from .common import app, fail, fmt, out, writable


@app.command("report")
def report_cmd(
    source: Path = typer.Argument(..., metavar="INPUT", help="eval-suite's database (.sqlite), a suite report JSON, "
                                  "an optimize-suite or agent run folder, a trainer's folder or metrics.jsonl, or "
                                  "a `train recipe` folder"),
    out_file: Optional[Path] = typer.Option(None, "--out", help="the HTML file to write (CSV and JSON beside it)"),
    compare: Optional[Path] = typer.Option(None, "--compare", help="a second suite input: INPUT as A, this as B, "
                                           "side by side with the changes"),
    run: Optional[str] = typer.Option(None, "--run", metavar="ID", help="the run of INPUT's database to show "
                                      "(default: its latest; --list lists them)"),
    compare_run: Optional[str] = typer.Option(None, "--compare-run", metavar="ID", help="B's run: of --compare's "
                                              "database, or without --compare of INPUT's"),
    list_runs: bool = typer.Option(False, "--list", help="list the runs of INPUT's database (no page written)"),
    seed_runs: list[Path] = typer.Option([], "--seed-run", help="another seed's `train recipe` folder, drawn with "
                                         "INPUT's as bands (repeatable)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an earlier report's files (never an input)"),
) -> None:
    """Turn suite results, an agent run or training metrics into one self-contained HTML page."""
    from ..report import ReportInputError, write_report

    if list_runs:
        _list(source)
        return
    if out_file is None:
        fail("--out FILE.html is required (or --list, to list a database's runs)")
    writable(out_file, "--out", file=True)
    if out_file.suffix.lower() not in (".html", ".htm"):
        fail(f"--out {out_file}: give an .html file (the CSV and JSON are written beside it)")
    for path in (out_file, out_file.with_suffix(".csv"), out_file.with_suffix(".json")):
        if not path.exists():
            continue
        if any(path.resolve() == i.resolve() or i.resolve() in path.resolve().parents
               for i in (source, compare, *seed_runs) if i):
            fail(f"--out {out_file}: {path} is (in) the report's input: write the report elsewhere")
        if not overwrite:
            fail(f"--out {out_file}: {path} exists: write elsewhere, or pass --overwrite to replace it")
    try:
        written = write_report(source, out_file, compare, run, compare_run, tuple(seed_runs))
    except (ReportInputError, OSError) as exc:
        fail(str(exc))
    for path in written:
        out.print(str(path), highlight=False, soft_wrap=True)


def _list(source: Path) -> None:
    """One line per run of a suite database: its number, when it ended, what it judged and how it went."""
    from ..report.inputs import ReportInputError, database_runs, is_database

    if not is_database(source):
        fail(f"{source}: --list lists the runs of eval-suite's database; this is no database")
    try:
        stored = database_runs(source)
    except ReportInputError as exc:
        fail(str(exc))
    if not stored:
        fail(f"{source}: holds no suite run yet (eval-suite stores one when a run ends)")
    out.print("run  ended             backend  tasks  pass    vs compile  suite -> solutions", highlight=False,
              soft_wrap=True)
    for report in stored:
        r, s = report["run"], report["overall"]
        ended = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["finished"]))
        out.print(f"{r['id']:>3}  {ended}  {r['backend']:<7}  {s['n']:>5}  {s['pass_rate']:>6.1%}  "
                  f"{fmt(s['geomean_speedup_vs_compile'], '.2f', 'x'):>10}  {r['suite']} -> {r['solutions']}",
                  highlight=False, soft_wrap=True, markup=False)
