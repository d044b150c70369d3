"""Isolation of the candidate's process beyond a separate process: Linux namespaces through `unshare`.

Active protection (recorded in every verdict as `sandbox`):
- `net`: a network namespace of its own with no interfaces: no connection leaves the process;
- `pid`: a PID namespace of its own: when the worker ends, the kernel kills everything it started, including
  daemons that left its session (`setsid`), so no process outlives the evaluation;
- `user`: the namespaces are created unprivileged (the worker is root only inside them);
- `memory`: an address-space limit (`RLIMIT_AS`, default 80% of RAM), so a runaway allocation fails inside the
  candidate instead of pushing the machine into the OOM killer. (CUDA cannot start under RLIMIT_AS, another
  reason this sandbox is not yet used on the cuda backend.)
A small shell is the namespace's init (PID 1 ignores signals it has no handler for), so the worker's own
crashes surface as exit status 128 + signal.

Not yet here (issue 3): a read-only view of the filesystem, an unprivileged uid (as root, RLIMIT_NPROC does not
stop a fork bomb), and the cuda backend (CUDA IPC across PID namespaces is unverified; `auto` keeps it off there).
"""

from __future__ import annotations

import functools
import os
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


def default_memory_limit() -> int:
    """80% of physical memory, in bytes."""
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 0.8)


def command_prefix(active: str, memory_bytes: int) -> list[str]:
    if active != "namespaces":
        return []
    return [*UNSHARE, "prlimit", f"--as={memory_bytes}", "--", *INIT_SHIM]


def describe(active: str, memory_bytes: int) -> str:
    if active != "namespaces":
        return "none (separate process only)"
    return f"namespaces: net, pid, user (unshare); address space <= {memory_bytes / 2**30:.1f} GiB"
