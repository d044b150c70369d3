"""Isolation of the candidate's process beyond a separate process: Linux namespaces through `unshare`.

Active protection (recorded in every verdict as `sandbox`):
- `net`: a network namespace of its own with no interfaces: no connection leaves the process;
- `pid`: a PID namespace of its own: when the worker ends, the kernel kills everything it started, including
  daemons that left its session (`setsid`), so no process outlives the evaluation;
- `user`: the namespaces are created unprivileged (the worker is root only inside them).
A small shell is the namespace's init (PID 1 ignores signals it has no handler for), so the worker's own
crashes surface as exit status 128 + signal.

Not yet here (issue 3): a read-only view of the filesystem, an unprivileged uid, resource limits, and the
CUDA backend (CUDA IPC across PID namespaces is unverified; `auto` keeps it off there).
"""

from __future__ import annotations

import functools
import shutil
import subprocess

UNSHARE = ["unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child", "--mount-proc"]
INIT_SHIM = ["sh", "-c", '"$@"; exit $?', "cuda-agent-init"]


@functools.lru_cache(maxsize=None)
def namespaces_available() -> bool:
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def resolve(mode: str, backend: str) -> str:
    """The protection to apply: 'namespaces' or 'none' (mode is 'auto', 'namespaces' or 'none')."""
    if mode not in ("auto", "namespaces", "none"):
        raise ValueError(f"sandbox must be auto, namespaces or none, not {mode!r}")
    if mode == "none" or (mode == "auto" and backend != "cpu"):
        return "none"
    if not namespaces_available():
        if mode == "namespaces":
            raise RuntimeError("sandbox 'namespaces' requested but `unshare --user --net --pid` does not work here")
        return "none"
    return "namespaces"


def command_prefix(active: str) -> list[str]:
    return [*UNSHARE, *INIT_SHIM] if active == "namespaces" else []


def describe(active: str) -> str:
    return "namespaces: net, pid, user (unshare)" if active == "namespaces" else "none (separate process only)"
