"""The `optimize --module` / `--hf-model` part of an agent run's page: what `RUN/module.json` records (the task made
from the user's module, the export of the best kernel, and the whole model checked with it), so the kernel
engineer's whole path reads as one page: episode, kernel, drop-in package, whole-model outputs and time."""

from __future__ import annotations

from typing import Any

from .page import esc, num, table, text


def module_section(record: dict[str, Any]) -> tuple[str, str]:
    """The section's title and HTML."""
    parts = [f"<p>task <code>{esc(record.get('task'))}</code>, made from the module</p>"]
    parts += [f"<p class='muted'>{esc(note)}</p>" for note in record.get("task_notes") or []]
    export = record.get("export")
    if export is None:
        parts.append("<p class='bad'>nothing exported: the episode found no verified kernel</p>")
        return "Your module", "".join(parts)
    parts.append(table(["", ""], [[text(k), text(export.get(key))] for k, key in (
        ("package", "package"), ("drop-in class", "class"), ("custom op namespace", "namespace"),
        ("kernels build", "kernels_build"))], text_columns=(0, 1)))
    parts += [f"<p class='muted'>{esc(note)}</p>" for note in export.get("notes") or []]
    check = record.get("check")
    if check is None:
        parts.append("<p class='muted'>whole-model check: only from a transformers model (--hf-model)</p>")
        return "Your module: the kernel, exported", "".join(parts)
    times, errors = check.get("time_us") or {}, check.get("error_vs_fp64") or {}
    match = check.get("within_tolerance")
    parts.append(
        f"<p>replaced {len(check.get('replaced') or [])} submodule(s): {esc(', '.join(check.get('replaced') or []))}"
        f"</p><p>outputs <span class='{'good' if match else 'bad'}'>{'match' if match else 'differ'}</span> (max abs "
        f"difference {num(check.get('max_abs_diff'), '.2e')}); against the model in fp64: original "
        f"{num(errors.get('original'), '.2e')}, replaced {num(errors.get('replaced'), '.2e')}</p>")
    parts.append(table(["whole model", "time (us, the judge's timing loop, median)"], [
        [text("original"), text(num(times.get("original"), ".1f"))],
        [text("with the kernel"), text(num(times.get("replaced"), ".1f"))],
        [text("speedup"), text(num(check.get("speedup"), ".3f", "x"))]], text_columns=(0,)))
    return "Your module: the kernel, exported and checked in the whole model", "".join(parts)
