"""Progress of a long command on stderr, moving whether or not anyone watches: on a terminal, rich bars with the
rate and the time left; piped (nohup, CI, a cluster's log), one line per step with the count, the time so far and
the time left, each written as it happens."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress as Bars, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m"


@dataclass
class _Line:
    """A piped bar: its counts and the start of this run (steps done before it, e.g. resumed, tell no rate)."""
    description: str
    total: int
    completed: int
    began: float = field(default_factory=time.monotonic)
    done_here: int = 0
    printed: float = 0.0


class Progress:
    """`with Progress(console) as p: bar = p.add("judging", total=n); p.advance(bar, "level1/19: reward 3")`;
    `resumed=True` counts a step that took no time (kept out of the time left). Piped, a line is written for each
    step done, at most one per `every_s` seconds (and always the last)."""

    def __init__(self, console: Console, every_s: float = 0.0):
        self.console, self.lines, self.every_s = console, {}, every_s
        self.bars = Bars(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                         TextColumn("left"), TimeRemainingColumn(), TextColumn("{task.fields[last]}"),
                         console=console) if console.is_terminal else None

    def __enter__(self) -> "Progress":
        if self.bars:
            self.bars.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.bars:
            self.bars.__exit__(*exc)

    def add(self, description: str, total: int, completed: int = 0) -> int:
        if self.bars:
            return self.bars.add_task(description, total=total, completed=completed, last="")
        self.lines[len(self.lines)] = _Line(description, total, completed)
        return len(self.lines) - 1

    def advance(self, bar: int, last: str, steps: int = 1, resumed: bool = False) -> None:
        """`steps` more done (0: only `last` changes), `last` saying what the latest was."""
        if self.bars:
            self.bars.update(bar, advance=steps, last=last)
            return
        line = self.lines[bar]
        line.completed += steps
        line.done_here += 0 if resumed else steps
        now = time.monotonic()
        if not steps or (now - line.printed < self.every_s and line.completed < line.total):
            return
        line.printed, elapsed = now, now - line.began
        left = "" if not line.done_here or line.completed >= line.total else \
            f", about {duration(elapsed / line.done_here * (line.total - line.completed))} left"
        self.console.print(f"{line.description} {line.completed}/{line.total} ({duration(elapsed)}{left}): {last}",
                           highlight=False, soft_wrap=True, markup=False)
