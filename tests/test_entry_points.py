"""The three ways to start the command line list the same commands (`train` was once registered after
`python -m cuda_agent.cli` had already run the app, so that form lacked it)."""

import os
import re
import shutil
import subprocess
import sys


def commands(argv: list[str]) -> set[str]:
    run = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"})
    assert run.returncode == 0, run.stderr[-2000:]
    section = run.stdout.split("Commands", 1)[1]
    return set(re.findall(r"^[│|]\s+([a-z][a-z-]*)\s", section, re.MULTILINE))


def test_every_entry_point_lists_the_same_commands():
    script = shutil.which("cuda-agent")
    assert script, "the cuda-agent script is not installed (pip install -e .)"
    listed = [commands([sys.executable, "-m", "cuda_agent.cli"]), commands([sys.executable, "-m", "cuda_agent"]),
              commands([script])]
    assert listed[0] == listed[1] == listed[2], listed
    assert {"eval", "eval-suite", "optimize", "data", "model", "report", "train"} <= listed[0], listed[0]
