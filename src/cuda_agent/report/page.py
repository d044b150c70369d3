"""The HTML around the views: one self-contained page (plotly.js inlined, no network), sortable tables, and a banner
that shows any script error on the page itself."""

from __future__ import annotations

import html
import math
from typing import Any, Iterable

import plotly.io as pio
from plotly.offline import get_plotlyjs

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1280px;
       padding: 0 16px; color: #1d2330; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 32px; border-bottom: 1px solid #dde2ea; }
.meta { color: #5b6577; margin: 0 0 12px; } .meta code { font-size: 12px; }
table { border-collapse: collapse; margin: 8px 0 16px; font-variant-numeric: tabular-nums; }
th, td { padding: 4px 10px; border-bottom: 1px solid #e8ebf0; text-align: right; vertical-align: top; }
th { background: #f4f6f9; position: sticky; top: 0; cursor: default; }
table.sortable th { cursor: pointer; } table.sortable th:hover { background: #e6ebf3; }
td.text, th.text { text-align: left; } td.reason { max-width: 480px; color: #5b6577; font-size: 12px; }
.good { color: #0a7a3b; } .bad { color: #b3261e; } .muted { color: #8a93a3; }
pre { white-space: pre-wrap; word-break: break-word; margin: 0; font-size: 12px; max-width: 860px; }
details summary { cursor: pointer; color: #2f5fb3; }
#script-errors { display: none; background: #fdecea; color: #8c1d18; padding: 8px 12px; border-radius: 4px; }
"""

# Click a header to sort by it (numbers by their data-v value, text alphabetically); click again to reverse.
SORT_SCRIPT = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (th, col) {
    th.addEventListener("click", function () {
      var body = table.tBodies[0], rows = Array.from(body.rows), up = th.dataset.order !== "asc";
      rows.sort(function (a, b) {
        var x = a.cells[col].dataset.v, y = b.cells[col].dataset.v;
        var nx = parseFloat(x), ny = parseFloat(y);
        var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : String(x).localeCompare(String(y));
        return up ? c : -c;
      });
      th.dataset.order = up ? "asc" : "desc";
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
"""

ERROR_BANNER = """
window.addEventListener("error", function (e) {
  var box = document.getElementById("script-errors");
  if (!box) return;  // before the body exists: the browser's console still has it
  box.style.display = "block";
  box.textContent += "This page failed to draw part of itself: " + e.message + "\\n";
});
"""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def num(value: Any, fmt: str = ".3g", suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:{fmt}}{suffix}"


def pct(value: float | None) -> str:
    return num(None if value is None else 100 * value, ".1f", "%")


class Cell:
    """A table cell: what it shows (HTML, escaped by the caller's helpers), how it sorts, its CSS class."""

    def __init__(self, shown: str, sort: Any = None, css: str = ""):
        self.shown, self.sort, self.css = shown, shown if sort is None else sort, css


def text(value: Any, css: str = "text") -> Cell:
    return Cell(esc(value if value is not None else "-"), "" if value is None else str(value), css)


def number(value: Any, fmt: str = ".3g", suffix: str = "", css: str = "") -> Cell:
    finite = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return Cell(num(value, fmt, suffix), value if finite else "-1e308", css)


def table(headers: list[str], rows: Iterable[list[Cell]], sortable: bool = False, text_columns=()) -> str:
    head = "".join(f'<th class="{"text" if i in text_columns else ""}">{esc(h)}</th>' for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(f'<td class="{c.css}" data-v="{esc(c.sort)}">{c.shown}</td>' for c in row)
                   + "</tr>" for row in rows)
    return (f'<table class="{"sortable" if sortable else ""}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>")


def figure(fig) -> str:
    return pio.to_html(fig, full_html=False, include_plotlyjs=False, config={"displaylogo": False, "responsive": True})


def document(title: str, meta: str, sections: list[tuple[str, str]]) -> str:
    parts = "".join(f"<h2>{esc(name)}</h2>\n{body}\n" for name, body in sections)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>{STYLE}</style>
<script>{ERROR_BANNER}</script>
<script>{get_plotlyjs()}</script>
</head><body>
<div id="script-errors"></div>
<h1>{esc(title)}</h1>
<p class="meta">{meta}</p>
{parts}
<script>{SORT_SCRIPT}</script>
</body></html>
"""
