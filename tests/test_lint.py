"""The tree passes the linter with the project's settings (pyproject.toml's [tool.ruff]): pyflakes' errors (undefined
names, unused imports and variables), pycodestyle's, lines of at most 120 characters."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_tree_passes_the_linter():
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed: scripts/setup.sh installs requirements-ci.txt's pin")
    run = subprocess.run([ruff, "check", "--no-cache", "src", "tests", "benchmarks", "scripts"], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
