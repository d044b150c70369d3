"""The recipe's steps (recipe.py): each in its own folder under the run folder, `done.json` when it ends (with the
step's key: step_keys.py), and the recipe's time limit. A rerun skips a done step of the same key and refuses one of
another; a step done with the same key in a `reuse` run folder (another arm of the same seed) is linked, not run."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Callable

from .step_keys import KEY_FILE


class StepMismatch(ValueError):
    """A step folder of the run holds the result of other settings or inputs."""


class Steps:
    def __init__(self, out: Path, reuse: list[Path] = (), time_limit_s: float | None = None,
                 log: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic):
        self.out, self.reuse, self.log, self.clock = Path(out), [Path(r) for r in reuse], log, clock
        self.deadline = clock() + (time_limit_s if time_limit_s is not None else math.inf)
        self.keys: dict[str, str] = {}  # each step met so far -> its key

    def out_of_time(self) -> bool:
        return self.clock() > self.deadline

    def left(self, name: str) -> float:
        """Seconds left for step `name`; TimeoutError when none are."""
        left = self.deadline - self.clock()
        if left <= 0:
            raise TimeoutError(f"time limit reached before {name}")
        return left

    def run(self, name: str, key: str, run: Callable[[Path], dict]) -> dict:
        """Step `name`'s result: read back when done before with this key, linked from a reuse folder that has it,
        else `run(folder)`'s, then kept in `done.json` (with the key, which the result returned leaves out)."""
        self.keys[name] = key
        result = self._result(name, key, run)
        result.pop("key", None)
        return result

    def _result(self, name: str, key: str, run: Callable[[Path], dict]) -> dict:
        folder = self.out / name
        done = folder / "done.json"
        if done.is_file():
            result = json.loads(done.read_text())
            if result.get("key") != key:
                raise StepMismatch(f"{folder} holds a result of other settings or inputs (step key "
                                   f"{result.get('key') or 'none: an older version'}, these settings' {key}): use "
                                   f"another --out, or delete {folder} and the steps after it")
            self.log(f"recipe: {name} done before")
            return result
        for other in self.reuse:
            theirs = other / name / "done.json"
            if not folder.exists() and theirs.is_file() and json.loads(theirs.read_text()).get("key") == key:
                folder.parent.mkdir(parents=True, exist_ok=True)
                folder.symlink_to(theirs.parent.resolve(), target_is_directory=True)
                self.log(f"recipe: {name} taken from {other} (same inputs and settings)")
                return json.loads(done.read_text())
        started = folder / KEY_FILE
        if started.is_file() and started.read_text() != key:
            raise StepMismatch(f"{folder} holds a half-done step of other settings or inputs: use another --out, or "
                               f"delete {folder}")
        self.left(name)
        self.log(f"recipe: {name}")
        folder.mkdir(parents=True, exist_ok=True)
        started.write_text(key)
        result = {**run(folder), "key": key}
        done.write_text(json.dumps(result, indent=2, default=str))
        return result
