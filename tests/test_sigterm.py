"""SIGTERM, as schedulers and `docker stop` send it (to the main process only), is taken as Ctrl-C: the work in flight
finishes and is stored, the judge's worker processes stop, temporary folders are removed, and the command exits 143.
The real command line runs as a subprocess on the cpu backend; a reference that sleeps as it is imported keeps its
evaluation in flight while the signal arrives, and a candidate that raises ends it without a build or baseline."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from conftest import ROOT, TASKS

SLEEPY = "import time\n\ntime.sleep({})  # in the reference worker: the evaluation stays in flight meanwhile\n\n"
RAISES = '''import torch


class ModelNew(torch.nn.Module):
    def __init__(self, scale, shift):
        super().__init__()

    def forward(self, x):
        raise RuntimeError("not written yet")
'''


def descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        for children in Path(f"/proc/{todo.pop()}/task").glob("*/children"):
            try:
                kids = {int(k) for k in children.read_text().split()}
            except OSError:  # that thread or process ended meanwhile
                continue
            todo += kids - found
            found |= kids
    return found


def started(pid: int) -> tuple[str, str] | None:
    """(start time, state) of a process, None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[19], fields[0]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def terminate_in_flight(args: list[str], env: dict[str, str],
                        times: int = 1) -> tuple[subprocess.CompletedProcess, list[int]]:
    """Run the CLI, send it SIGTERM once its reference worker runs (`times` times: each after the command has said
    it took the one before, since two signals that land before its main thread runs Python again make one call of
    its handler, as a loaded CI machine showed even 3 s apart), and return the result and the processes it started
    that still run after it ended (killed then: a failure leaves none behind)."""
    proc = subprocess.Popen([sys.executable, "-m", "cuda_agent", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    said: list[str] = []  # its stderr so far, and its stdout: read beside (neither pipe fills)
    printed: list[str] = []
    readers = [threading.Thread(target=lambda pipe=pipe, into=into: into.extend(iter(pipe.readline, "")), daemon=True)
               for pipe, into in ((proc.stderr, said), (proc.stdout, printed))]
    for reader in readers:
        reader.start()
    seen: dict[int, tuple[str, str]] = {}
    deadline, sent = time.monotonic() + 120, 0
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            for pid in descendants(proc.pid) - set(seen):
                seen[pid] = started(pid)
            taken = sum(line.startswith("cuda-agent: SIGTERM") for line in list(said))
            if sent < times and taken == sent and \
                    any("reference_worker" in cmdline(pid) for pid in seen):  # (once it has exec'd)
                proc.send_signal(signal.SIGTERM)
                sent += 1
            time.sleep(0.05)
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        for reader in readers:
            reader.join(timeout=5)
    finally:
        proc.kill()
    stdout, stderr = "".join(printed), "".join(said)

    def alive() -> list[int]:
        return [pid for pid, first in seen.items() if first and (now := started(pid)) and now[0] == first[0]
                and now[1] not in "ZX"]

    settle = time.monotonic() + 3  # a worker killed as the command ended may still be exiting: seconds, not ~50
    while (left := alive()) and time.monotonic() < settle:
        time.sleep(0.05)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert sent == times, f"no reference worker was seen, or the command ended first:\n{stderr}"
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), left


def sleepy_task(folder: Path, seconds: int = 6) -> Path:
    folder.mkdir(parents=True)
    (folder / "1_Sleepy.py").write_text(SLEEPY.format(seconds) + (TASKS / "affine_relu.py").read_text())
    return folder / "1_Sleepy.py"


def suite_args(tmp_path: Path, sleep: int = 6) -> list[str]:
    suite, solutions = tmp_path / "suite", tmp_path / "solutions"
    sleepy_task(suite / "level1", sleep)
    (solutions / "level1").mkdir(parents=True)
    (solutions / "level1" / "1_Sleepy.py").write_text(RAISES)
    return ["eval-suite", str(suite), "--solutions", str(solutions), "--backend", "cpu", "--cache-dir",
            str(tmp_path / "cache"), "--db", str(tmp_path / "results.sqlite")]


def test_sigterm_finishes_the_evaluation_in_flight_and_exits_143(tmp_path):
    """eval-suite: the verdict in flight is stored (the rerun resumes it), no worker outlives the command, no run
    folder is left."""
    args, scratch, cache = suite_args(tmp_path), tmp_path / "tmp", tmp_path / "cache"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    result, left = terminate_in_flight(args, env)
    assert result.returncode == 143, result.stderr
    assert "SIGTERM" in result.stderr and "level1/1_Sleepy.py: reward -1" in result.stderr  # judged after it
    assert not left, [cmdline(pid) for pid in left]
    assert list((cache / "runs").iterdir()) == [] and list(scratch.iterdir()) == []

    again = subprocess.run([sys.executable, "-m", "cuda_agent", *args, "--json"], cwd=ROOT, env=env, text=True,
                           capture_output=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "level1/1_Sleepy.py: resumed" in again.stderr, result.stderr
    assert "not written yet" in json.loads(again.stdout)["tasks"][0]["verdict"]["error"]


def test_a_second_sigterm_abandons_the_evaluation_in_flight(tmp_path):
    """As a second Ctrl-C does: the judge stops at once, nothing is stored, nothing is left running; exit 143. (The
    reference sleeps 60 s, so the second signal, sent once the first was taken, lands while it is in flight even on a
    loaded machine; a 6 s sleep once ended first in CI.)"""
    args, cache = suite_args(tmp_path, sleep=60), tmp_path / "cache"
    result, left = terminate_in_flight(args, dict(os.environ), times=2)
    assert result.returncode == 143, result.stderr
    assert "SIGTERM again" in result.stderr and "1_Sleepy.py: reward" not in result.stderr
    assert not left, [cmdline(pid) for pid in left]
    assert list((cache / "runs").iterdir()) == []


def test_sigterm_stops_a_single_evaluation_and_removes_its_folders(tmp_path):
    """eval of a dataset row: its row folder (in TMPDIR), the run folders and the workers are gone; exit 143."""
    dataset, scratch, cache = tmp_path / "rows.jsonl", tmp_path / "tmp", tmp_path / "cache"
    dataset.write_text(json.dumps({"code": sleepy_task(tmp_path / "task").read_text()}) + "\n")
    (tmp_path / "model_new.py").write_text(RAISES)
    scratch.mkdir()
    args = ["eval", str(dataset), "--row", "0", "--solution", str(tmp_path / "model_new.py"), "--backend", "cpu",
            "--cache-dir", str(cache)]
    result, left = terminate_in_flight(args, {**os.environ, "TMPDIR": str(scratch)})
    assert result.returncode == 143, result.stderr
    assert "SIGTERM" in result.stderr
    assert not left, [cmdline(pid) for pid in left]
    assert list((cache / "runs").iterdir()) == [] and list(scratch.iterdir()) == []
