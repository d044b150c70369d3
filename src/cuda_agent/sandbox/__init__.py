"""Isolation for untrusted processes (the candidate's worker; the agent's commands): one `Sandbox` per launch.

Layers, each reported by `describe()` (and in every verdict as `sandbox`):
- namespaces via `unshare`: user (no capabilities outside), network (no interfaces: nothing leaves), PID (when
  the command ends the kernel kills everything it started), mount (the view below);
- a filesystem view (`init.py`): everything read-only except a private /tmp, /dev/shm and the `writable` paths;
  the judge's data (`hidden`) covered; only standard and GPU device nodes; a second user + mount namespace locks
  it so the command's root cannot undo it;
- a cgroup when the hierarchy is writable: process count (fork bombs) and memory, killed as one at the end;
- rlimits: CPU seconds, file size, no core dumps, the process count when not root (root ignores RLIMIT_NPROC),
  and on the cpu backend an address-space limit (it breaks CUDA's initialisation, so never on the GPU).
The process keeps the caller's host uid: an unprivileged host uid would lose read access to Python installs under
/root, so files are protected by the read-only view rather than by ownership.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .cgroup import Cgroup

INIT = Path(__file__).with_name("init.py")
# (--ipc: System V shared memory made inside goes with the sandbox, and no candidate reaches another's)
OUTER = ["unshare", "--user", "--map-root-user", "--net", "--ipc", "--pid", "--fork", "--kill-child", "--mount",
         "--mount-proc"]
LOCK = ["unshare", "--user", "--map-root-user", "--mount"]
INIT_SHIM = ["sh", "-c", '"$@"; exit $?', "cuda-agent-init"]  # PID 1 ignores unhandled signals: keep it a shell
# The command runs in a user namespace below PID 1's, so it holds no capability over it: in PID 1's own namespace
# it could ptrace it or write its memory (`/proc/1/mem`) and run code there that is never stopped nor counted
# (held out, red team 2026-12-05).
BELOW_INIT = ["unshare", "--user", "--map-root-user", "--"]
JOIN_CGROUP = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n-1)); done; exec "$@"'
MODES = ("auto", "required", "none")


@dataclass
class Limits:
    memory_bytes: int | None = None  # None: 80% of physical memory
    max_processes: int = 4096  # threads count too
    cpu_seconds: int | None = 7200
    file_bytes: int = 32 << 30
    address_space: bool = False  # also cap the address space (cpu backend only)
    cpu_low: bool = False  # a low CPU weight for the whole group, where the cgroup's cpu controller is writable

    def memory(self) -> int:
        if self.memory_bytes:
            return self.memory_bytes
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 0.8)


SECRETS = ("/root", "/home", "/etc/shadow", "/etc/gshadow")  # hidden from every sandboxed command
# names of environment variables that hold credentials (OPENAI_API_KEY, HF_TOKEN, AWS_SECRET_ACCESS_KEY...)
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION", re.IGNORECASE)
REPLACED = ("/tmp", "/dev")  # fresh inside (init.py): an interpreter living there (a venv in /tmp) is bound back


def public_environ() -> dict[str, str]:
    """This process's environment without its credentials: what candidate code (its workers, its compilers) gets."""
    return {k: v for k, v in os.environ.items() if not SECRET_NAME.search(k)}


@dataclass
class View:
    """Paths as the sandboxed command sees them (at their own location). Home directories and the password hashes
    are always hidden (they hold keys and tokens); what Python needs from them is bound back read-only."""
    writable: list[Path] = field(default_factory=list)
    readable: list[Path] = field(default_factory=list)  # visible read-only even inside a hidden directory
    hidden: list[Path] = field(default_factory=list)  # covered by an empty directory (or file)

    def spec(self) -> dict[str, list[str]]:
        hidden = [*map(str, self.hidden), *(p for p in SECRETS if os.path.exists(p))]
        readable = [*map(str, self.readable), *_python_paths([*hidden, *REPLACED])]
        return {"writable": [str(p) for p in self.writable], "readable": list(dict.fromkeys(readable)),
                "hidden": hidden}


def _python_paths(hidden: list[str]) -> list[str]:
    """The interpreter, its libraries and this package where they lie inside a hidden directory."""
    roots = [sys.base_prefix, sys.prefix, *sys.path, str(Path(__file__).resolve().parents[2])]
    found = []
    for root in roots:
        if root and os.path.isdir(root) and any(root == h or root.startswith(h.rstrip("/") + "/") for h in hidden):
            found.append(os.path.realpath(root))
    # an interpreter reached through a symlink (pyenv shims, venvs) needs its real location too
    for exe in (sys.executable, os.path.realpath(sys.executable)):
        found.append(os.path.dirname(exe))
    # Strictly inside: a hidden or fresh folder itself is never bound back whole (a script run from /tmp puts /tmp on
    # sys.path, and Ray copies the driver's script folder onto its workers' sys.path).
    inside = [p for p in dict.fromkeys(found) if any(p.startswith(h.rstrip("/") + "/") for h in hidden)]
    return [p for p in inside if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in inside)]


@functools.lru_cache(maxsize=None)
def probe() -> str | None:
    """None when the full sandbox works here, else why not (checked once per process)."""
    if shutil.which("unshare") is None:
        return "`unshare` is not installed"
    box = Sandbox(View(), Limits(max_processes=64, cpu_seconds=60), use_cgroup=False)
    try:
        run = subprocess.run([*box.prefix(), "true"], capture_output=True, text=True, timeout=60, cwd="/")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"sandbox probe failed: {exc}"
    if run.returncode != 0:
        return f"sandbox probe failed: {(run.stderr.strip().splitlines() or ['exit %d' % run.returncode])[-1]}"
    return None


def resolve(mode: str) -> bool:
    """Whether to sandbox, for mode auto|required|none; raises RuntimeError when it is required but unavailable.
    `auto` falls back to plain processes where namespaces do not work (callers must say so loudly)."""
    if mode not in MODES:
        raise ValueError(f"sandbox must be one of {', '.join(MODES)}, not {mode!r}")
    if mode == "none":
        return False
    problem = probe()
    if problem and mode == "required":
        raise RuntimeError(f"the sandbox is required but unavailable here: {problem}")
    return problem is None


class Sandbox:
    """One sandboxed launch. `prefix()` goes before the command; `close()` after it ended (kills leftovers)."""

    def __init__(self, view: View, limits: Limits, cwd: Path | str = "/", use_cgroup: bool = True):
        self.view, self.limits, self.cwd = view, limits, str(cwd)
        self.cgroup = Cgroup.create(limits.max_processes, limits.memory(), limits.cpu_low) if use_cgroup else None

    def prefix(self) -> list[str]:
        spec = {**self.view.spec(), "cwd": self.cwd}
        join = ["sh", "-c", JOIN_CGROUP, "cuda-agent-cgroup", str(len(self.cgroup.procs)),
                *map(str, self.cgroup.procs)] if self.cgroup else []
        return [*join, *OUTER, sys.executable, "-I", str(INIT), json.dumps(spec), *LOCK, "prlimit",
                *self._rlimits(), "--", *INIT_SHIM, *BELOW_INIT]

    def _rlimits(self) -> list[str]:
        lim = self.limits
        flags = [f"--fsize={lim.file_bytes}", "--core=0"]
        if lim.cpu_seconds:
            flags.append(f"--cpu={lim.cpu_seconds}")
        if os.geteuid() != 0:
            flags.append(f"--nproc={lim.max_processes}")
        if lim.address_space:
            flags.append(f"--as={lim.memory()}")
        return flags

    def describe(self) -> str:
        lim, gib = self.limits, 2**30
        parts = ["namespaces: user, net, ipc, pid, mount (unshare)",
                 f"filesystem read-only except {len(self.view.writable)} path(s), /tmp and /dev/shm private, "
                 f"judge data and home directories hidden"]
        if self.cgroup:
            parts.append(f"cgroup v{self.cgroup.version}: processes <= {lim.max_processes}, "
                         f"memory <= {lim.memory() / gib:.1f} GiB" + (", low CPU weight" if self.cgroup.low else
                                                                        ", CPU weight unchanged" if lim.cpu_low
                                                                        else ""))
        elif os.geteuid() != 0:
            parts.append(f"processes <= {lim.max_processes} (rlimit)")
        else:
            parts.append("no cgroup: process count unbounded")
        parts.append(f"cpu <= {lim.cpu_seconds} s" if lim.cpu_seconds else "cpu time unbounded")
        if lim.address_space:
            parts.append(f"address space <= {lim.memory() / gib:.1f} GiB")
        return "; ".join(parts)

    def events(self) -> list[str]:
        return self.cgroup.events() if self.cgroup else []

    def close(self) -> None:
        if self.cgroup:
            self.cgroup.close()


def run(command: list[str], view: View, cwd: Path, timeout: float, limits: Limits | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run a command to completion in a fresh sandbox, stdout and stderr together (compilers of candidate code:
    what they read ends up in their diagnostics, so they must not see the judge's data, the host's secrets, its
    environment's (`env` defaults to `public_environ()`) or its stdin)."""
    box = Sandbox(view, limits or Limits(cpu_seconds=None), cwd=cwd)
    try:
        return run_bounded([*box.prefix(), *command], cwd, timeout, public_environ() if env is None else env)
    finally:
        box.close()


OUTPUT_KEPT = 1 << 20  # bytes of a compiler's output kept from its start, and as many from its end


def run_bounded(command: list[str], cwd: Path | str, timeout: float | None, env: dict[str, str] | None = None,
                kept: int = OUTPUT_KEPT) -> subprocess.CompletedProcess:
    """`subprocess.run` with stdout and stderr together, of which only the first and last `kept` bytes are held
    (held out, red team 2026-12-05: `_Pragma("message ...")` doubled 2**20 times prints ~9 GB in 100 s, all of it
    held in the judge's memory, four times over). TimeoutExpired as subprocess.run raises it."""
    import threading

    proc = subprocess.Popen(command, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=env)
    head, tail, dropped = bytearray(), bytearray(), [0]

    def drain() -> None:
        while chunk := proc.stdout.read1(1 << 16):
            room = kept - len(head)
            head.extend(chunk[:max(room, 0)])
            tail.extend(chunk[max(room, 0):])
            if len(tail) > kept:
                dropped[0] += len(tail) - kept
                del tail[:len(tail) - kept]

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        reader.join(5)
        raise
    reader.join()
    proc.stdout.close()
    middle = f"\n[... {dropped[0]} bytes of output dropped ...]\n".encode() if dropped[0] else b""
    out = (bytes(head) + middle + bytes(tail)).decode(errors="replace")
    return subprocess.CompletedProcess(command, proc.returncode, out)


NONE_DESCRIPTION = "none (separate process only)"
