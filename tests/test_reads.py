"""The kernel's record of what a process tree opened in a folder (workspace/reads.py): the object cache's key."""

import subprocess
import sys
from pathlib import Path

from cuda_agent.workspace.reads import Opened


def test_files_opened_anywhere_under_the_folder_are_seen_and_listings_are_not(tmp_path):
    (tmp_path / "kernels").mkdir()
    for name in ("kernels/a.h", "kernels/b.h", "model_new.py"):
        (tmp_path / name).write_text("x")
    script = "import os; open('kernels/a.h').read(); open('./kernels/../model_new.py').read(); os.listdir('kernels')"
    with Opened(tmp_path) as opened:
        subprocess.run([sys.executable, "-c", script], cwd=tmp_path, check=True)
    assert opened.files == {"kernels/a.h", "model_new.py"}


def test_an_overflowing_queue_leaves_the_reads_unknown(tmp_path):
    """Past the kernel's queue (16,384 events by default) nothing can be said: every file then counts as read."""
    for name in ("a", "b"):
        (tmp_path / name).write_text("x")
    queue = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    script = f"for _ in range({queue}):\n    open('a').close(); open('b').close()"  # (alternating: not merged)
    with Opened(tmp_path) as opened:
        subprocess.run([sys.executable, "-c", script], cwd=tmp_path, check=True)
    assert opened.files is None
