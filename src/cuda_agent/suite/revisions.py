"""Which KernelBench revision a suite's tasks come from (issue 33): KernelBench's problems changed over time (sizes,
inputs; some were replaced), so a published number holds for the files it was measured on. Each task file is looked
up by its git blob hash (what `git hash-object FILE` prints) in a table of every version of every problem file in
KernelBench's history (`kernelbench_revisions.json`, made by scripts/kernelbench_revisions.py from a clone), which
gives the dates that version was current.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from importlib import resources
from pathlib import Path


def blob_hash(data: bytes) -> str:
    """git's hash of a file's content (`git hash-object`)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@lru_cache(maxsize=1)
def table() -> dict:
    return json.loads(resources.files(__package__).joinpath("kernelbench_revisions.json").read_text())


def lookup(task_file: Path) -> dict | None:
    """The KernelBench file this task's content is a version of, and when that version was current (`current`:
    it still is, as of the table's newest commit); None for a file that is no version of one."""
    found = table()["files"].get(blob_hash(Path(task_file).read_bytes()))
    if found is None:
        return None
    path, first, last, current = found
    return {"path": path, "from": first, "to": last, "current": current}


def summarise(matches: list[dict | None]) -> dict:
    """Over a suite's tasks: how many are KernelBench files, how many of the newest revision, and the dates every
    known one was current at once (None when they come from revisions that never coexisted)."""
    known = [m for m in matches if m]
    start = max((m["from"] for m in known), default=None)
    end = min((m["to"] for m in known), default=None)
    newest = table()
    return {"tasks": len(matches), "kernelbench_files": len(known), "unknown": len(matches) - len(known),
            "newest_revision": sum(1 for m in known if m["current"]),
            "all_current_between": [start, end] if known and start <= end else None,
            "table": f"{newest['source']} up to {newest['head'][:10]} ({newest['head_date']})"}


def describe(summary: dict) -> str:
    """`summarise`'s answer as one sentence."""
    when, known = summary["all_current_between"], summary["kernelbench_files"]
    return (f"{known} of {summary['tasks']} tasks are KernelBench files, {summary['newest_revision']} of its newest "
            "revision; " + (f"all of them were current together from {when[0]} to {when[1]}" if when else
                            "they come from revisions that were never current together" if known else
                            "none is a KernelBench file of any revision") + f" (table: {summary['table']}).")
