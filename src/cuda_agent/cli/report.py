"""`report`: results as one self-contained page."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .common import app, fail, out, writable

@app.command("report")
def report_cmd(
    source: Path = typer.Argument(..., metavar="INPUT", help="eval-suite's database (.sqlite), a suite report JSON, "
                                  "an optimize-suite or agent run folder, or a trainer's folder or metrics.jsonl"),
    out_file: Path = typer.Option(..., "--out", help="the HTML file to write (CSV and JSON beside it)"),
    compare: Optional[Path] = typer.Option(None, "--compare", help="a second suite input: INPUT as A, this as B, "
                                           "side by side with the changes"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an earlier report's files (never an input)"),
) -> None:
    """Turn suite results, an agent run or training metrics into one self-contained HTML page."""
    writable(out_file, "--out", file=True)
    from ..report import ReportInputError, write_report

    if out_file.suffix.lower() not in (".html", ".htm"):
        fail(f"--out {out_file}: give an .html file (the CSV and JSON are written beside it)")
    for path in (out_file, out_file.with_suffix(".csv"), out_file.with_suffix(".json")):
        if not path.exists():
            continue
        if any(path.resolve() == i.resolve() or i.resolve() in path.resolve().parents for i in (source, compare) if i):
            fail(f"--out {out_file}: {path} is (in) the report's input: write the report elsewhere")
        if not overwrite:
            fail(f"--out {out_file}: {path} exists: write elsewhere, or pass --overwrite to replace it")
    try:
        written = write_report(source, out_file, compare)
    except (ReportInputError, OSError) as exc:
        fail(str(exc))
    for path in written:
        out.print(str(path), highlight=False, soft_wrap=True)
