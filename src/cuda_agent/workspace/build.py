"""Incremental build of a workspace candidate into the `cuda_extension` module.

Design (numbers in docs/measurements.md, "Build speed"):
- every translation unit compiles on its own, in parallel, in a folder of its own holding a copy of the workspace
  (the judge's `binding.cpp`: the judge's two template files only), and its object is cached under the backend's
  identity, the command line, the unit's source, the names of the files beside it, and the content of every one of
  them the compile opened, as the kernel reports the opens (`reads.Opened`): an assembler `.incbin` and names the
  compiler escapes are seen (held out: a kernel including or `.incbin`-ing `../model_new.py`, a C++/Python
  polyglot, kept its first object when only the Python changed; the compiler's own `-MD` list misses both). Files
  outside the folder (the toolchain's headers) count by size and time, from the `-MD` list. Editing a kernel
  recompiles the units that read it, not the others nor the precompiled header;
- torch-facing files (`*_binding.cpp`, the fixed `binding.cpp`) share one precompiled header of
  `torch/types.h` + pybind, built once per toolchain and cached;
- `.cu` kernels are pure CUDA and go through bare `nvcc` (no torch headers), about a second each.

The judge builds from its own copies of the candidate's files, plus its own `binding.cpp`/`binding_registry.h`.
With `confined`, every compiler run on candidate sources runs in the sandbox seeing its unit's folder and the
precompiled header only: an `#include "/root/.ssh/id_rsa"` would otherwise print the host's secrets into the build
log the agent reads, and a read of the other copies would go unseen. Without it (no sandbox) nothing confines a
compile, and every file of the workspace counts as read.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from .. import sandbox
from . import reads
from ..backend import EXTENSION_NAME, Backend
from .candidate import Candidate
from .cache_budget import touch

TEMPLATE_DIR = Path(__file__).parent / "template"
TEMPLATE_FILES = ("binding.cpp", "binding_registry.h")
COMPILE_TIMEOUT_S = 600
COMPILE_MEMORY_BYTES = 8 << 30  # each compiler run's (`#include "/dev/zero"` reads until memory runs out)
# each file a compiler run writes (objects, libraries): an assembler's `.fill` writes a GiB a second, and objects
# are cached for good (held out, red team 2026-12-05: a 1 GiB object cached, read whole into the judge's memory)
COMPILE_FILE_BYTES = 256 << 20
# the objects one build may add to the cache, all its units together; the rest are linked from the build folder and
# not kept (held out, red team 2026-12-06: 16 units of `.fill` added 3.6 GiB in 11 s, 256 of them would add 64 GiB,
# and every entry is within the cache budget's grace, so `cache_budget.trim` removed none of it)
BUILD_OBJECT_BYTES = 256 << 20
PCH_NAME = "cuda_agent_pch.h"
log = logging.getLogger(__name__)


@dataclass
class CompileStep:
    source: str
    cached: bool
    seconds: float
    ok: bool = True
    output: str = ""


@dataclass
class BuildResult:
    ok: bool
    build_dir: Path
    seconds: float
    error: str | None = None  # first failure reason, one line
    log: str = ""
    steps: list[CompileStep] = field(default_factory=list)

    @property
    def module_path(self) -> Path:
        return self.build_dir / f"{EXTENSION_NAME}.so"


class Builder:
    """Builds workspaces for one backend with a persistent object cache under `cache_dir`."""

    def __init__(self, backend: Backend, cache_dir: Path, jobs: int | None = None,
                 confined: list[Path] | None = None, budget_s: float | None = None):
        """`confined`: compile candidate sources in the sandbox with these folders hidden (None: plain processes).
        `budget_s`: seconds one workspace's build may take, all its units and the link together (held out, red team
        2026-12-05: only each unit was bounded, by COMPILE_TIMEOUT_S, so 255 slow units held the judge for hours)."""
        self.backend = backend
        self.cache_dir = Path(cache_dir)
        self.objects = self.cache_dir / "objects"
        self.objects.mkdir(parents=True, exist_ok=True)
        self.jobs = jobs or max(1, os.cpu_count() or 1)
        self.confined = confined
        self.budget_s = budget_s

    # ---- public --------------------------------------------------------------------------------------
    def build(self, candidate: Candidate, build_dir: Path, deadline: float = float("inf")) -> BuildResult:
        """`deadline` (time.monotonic): the caller's, where it comes before the budget's end."""
        start = time.perf_counter()
        deadline = min(deadline, time.monotonic() + (self.budget_s if self.budget_s is not None else float("inf")))
        build_dir = Path(build_dir)
        build_dir.mkdir(parents=True, exist_ok=True)
        candidate.write_to(build_dir)
        for name in TEMPLATE_FILES:  # the judge's own, whatever the candidate shipped
            shutil.copyfile(TEMPLATE_DIR / name, build_dir / name)

        def fail(msg: str, log: str = "", steps=()) -> BuildResult:
            return BuildResult(False, build_dir, time.perf_counter() - start, msg, log or msg, list(steps))

        if "model_new.py" not in candidate.files:
            return fail("workspace has no model_new.py")
        try:
            kernel_srcs, binding_srcs = self._classify(candidate)
        except ValueError as exc:
            return fail(str(exc))
        if not kernel_srcs and not binding_srcs:
            return fail("workspace has no kernel sources under kernels/")

        judge_files = {name: (TEMPLATE_DIR / name).read_bytes() for name in TEMPLATE_FILES}
        workspace = {**candidate.files, **judge_files}
        pch_flags, pch_note, pch_dir = self._pch_flags()
        jobs = [(src, self.backend.kernel_command(src, "{obj}"), workspace) for src in kernel_srcs]
        binding_cmd = [self.backend.cxx, *self.backend.binding_flags(), *pch_flags]
        jobs += [(src, [*binding_cmd, "-c", src, "-o", "{obj}"], judge_files if src == "binding.cpp" else workspace)
                 for src in ["binding.cpp", *binding_srcs]]
        quota = _Quota(BUILD_OBJECT_BYTES)
        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            results = list(pool.map(lambda job: self._compile(build_dir, candidate.origin, job, pch_dir, deadline,
                                                              quota), enumerate(jobs)))
        steps = [step for step, _ in results]
        log = "\n".join(filter(None, [pch_note] + [f"[{s.source}] {s.output}" for s in steps if s.output]))
        failed = [s for s in steps if not s.ok]
        if failed:
            return fail(f"compile error: {_first_error(failed[0].output) or failed[0].source}", log, steps)

        all_text = "\n".join(candidate.text().values())
        libraries = self.backend.extra_libraries(all_text)
        objs = [str(obj) for _, obj in results]
        link = self.backend.link_command(objs, f"{EXTENSION_NAME}.so", libraries)
        t0 = time.perf_counter()
        proc = self._run(link, sandbox.View(writable=[build_dir], readable=[self.objects], hidden=[candidate.origin]),
                         deadline)
        steps.append(CompileStep("<link>", False, time.perf_counter() - t0, proc.returncode == 0, proc.stdout))
        if proc.returncode != 0:
            return fail(f"link error: {_first_error(proc.stdout) or 'see log'}", log + "\n" + proc.stdout, steps)
        return BuildResult(True, build_dir, time.perf_counter() - start, None, log, steps)

    # ---- internals -----------------------------------------------------------------------------------
    def _classify(self, candidate: Candidate) -> tuple[list[str], list[str]]:
        kernels, bindings = [], []
        for rel in sorted(candidate.files):
            if not rel.startswith("kernels/"):
                continue
            if rel.endswith("_binding.cpp"):
                bindings.append(rel)
            elif rel.endswith(self.backend.kernel_suffix):
                kernels.append(rel)
            elif rel.endswith((".cu", ".cpp", ".cc")):
                raise ValueError(f"{rel}: the {self.backend.name} backend compiles kernels/*"
                                 f"{self.backend.kernel_suffix} and kernels/*_binding.cpp only")
        return kernels, bindings

    def _compile(self, build_dir: Path, origin: Path, job: tuple[int, tuple[str, list[str], dict[str, bytes]]],
                 pch_dir: Path, deadline: float = float("inf"), quota: "_Quota | None" = None
                 ) -> tuple[CompileStep, Path]:
        """Compile `src` in a folder of its own holding `files`, unless an object of the same inputs is cached. Its
        compiler sees neither the build folder nor the candidate's `origin` (read by an absolute path, a file there
        would be in no key)."""
        index, (src, cmd, files) = job
        key = hashlib.sha256("\0".join([self.backend.identity(), *cmd, *sorted(files)]).encode())
        key.update(files[src])
        manifest = self.objects / f"{key.hexdigest()}.deps"
        try:
            cached = self.objects / f"{key.hexdigest()}-{_state(files, json.loads(manifest.read_text()))}.o"
            if cached.exists():
                touch(cached)  # (its last use: the cache's budget removes the least recently used)
                return CompileStep(src, True, 0.0), cached
        except (OSError, ValueError):
            pass
        unit = build_dir / ".units" / str(index)
        shutil.rmtree(unit, ignore_errors=True)
        for rel, data in files.items():
            (unit / rel).parent.mkdir(parents=True, exist_ok=True)
            (unit / rel).write_bytes(data)
        t0 = time.perf_counter()
        obj, deps = unit / ".object.o", unit / ".object.d"
        if deadline - time.monotonic() <= 0:
            shutil.rmtree(unit, ignore_errors=True)
            return CompileStep(src, False, 0.0, False, "error: the build budget is spent"), Path(os.devnull)
        with reads.Opened(unit) as opened:
            proc = self._run([part.replace("{obj}", str(obj)) for part in cmd] + ["-MD", "-MF", str(deps)],
                             sandbox.View(writable=[unit], readable=[pch_dir], hidden=[build_dir, origin]), deadline)
        step = CompileStep(src, False, time.perf_counter() - t0, proc.returncode == 0, proc.stdout.strip())
        cached = Path(os.devnull)
        if proc.returncode == 0 and quota is not None and not quota.take(obj.stat().st_size):
            cached = build_dir / ".objects" / f"{index}.o"  # (linked from here, not kept)
            cached.parent.mkdir(exist_ok=True)
            os.replace(obj, cached)
            step.output = (step.output + "\n" if step.output else "") + \
                f"note: not cached (this build's objects passed {quota.limit >> 20} MiB)"
        elif proc.returncode == 0:
            seen = opened.files if self.confined is not None and opened.files is not None else set(files)
            read = sorted({*_dependencies(unit, deps.read_text()), *(seen & set(files))})
            _replace_text(manifest, json.dumps(read))
            cached = self.objects / f"{key.hexdigest()}-{_state(files, read)}.o"
            fd, tmp = tempfile.mkstemp(suffix=".o", dir=self.objects)
            os.close(fd)
            shutil.copyfile(obj, tmp)
            os.replace(tmp, cached)
        shutil.rmtree(unit, ignore_errors=True)
        return step, cached

    def _run(self, cmd: list[str], view: sandbox.View, deadline: float = float("inf")) -> subprocess.CompletedProcess:
        """A compiler or linker run over candidate sources in the view's first writable folder: confined when asked
        (`confined` hidden too: the judge's cache, the folders of the episodes it judges: `Judge.conceal`)."""
        cwd = view.writable[0]
        timeout = max(0.1, min(COMPILE_TIMEOUT_S, deadline - time.monotonic()))
        if self.confined is None:
            return _run(cmd, cwd, timeout)
        view.hidden += self.confined
        try:
            return sandbox.run(cmd, view, cwd, timeout, compile_limits())
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(cmd, 124, f"error: compiler timed out after {timeout:.0f}s")

    def _pch_flags(self) -> tuple[list[str], str, Path]:
        """Build (once, under a lock) the precompiled torch header; return the flags that use it, a note and its
        folder."""
        flags = self.backend.binding_flags()
        header = self.backend.pch_header()
        key = hashlib.sha256("\0".join([self.backend.identity(), *flags, header]).encode()).hexdigest()[:20]
        pch_dir = self.cache_dir / "pch" / key
        pch_dir.mkdir(parents=True, exist_ok=True)
        gch = pch_dir / f"{PCH_NAME}.gch"
        use = ["-include", str(pch_dir / PCH_NAME), "-Winvalid-pch"]
        with open(pch_dir / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if gch.exists():
                return use, "", pch_dir
            (pch_dir / PCH_NAME).write_text(header)
            tmp = pch_dir / f"{PCH_NAME}.gch.tmp"
            t0 = time.perf_counter()
            log.info("building torch's precompiled header, once for this machine and cache (30-60 s): %s", pch_dir)
            proc = _run([self.backend.cxx, *flags, "-x", "c++-header", PCH_NAME, "-o", tmp.name], pch_dir)
            if proc.returncode != 0:
                tmp.unlink(missing_ok=True)
                return [], f"precompiled header unavailable, compiling without it: {_first_error(proc.stdout)}", \
                    pch_dir
            os.replace(tmp, gch)
            note = f"built precompiled header in {time.perf_counter() - t0:.1f}s ({gch.stat().st_size / 1e6:.0f} MB)"
            log.info("%s: %s", note, gch)
            return use, note, pch_dir


class _Quota:
    """Bytes one build's new objects may take in the cache, shared by its compiles."""

    def __init__(self, limit: int):
        self.limit, self.left, self.lock = limit, limit, threading.Lock()

    def take(self, size: int) -> bool:
        with self.lock:
            if size > self.left:
                return False
            self.left -= size
            return True


def _dependencies(build_dir: Path, make_rule: str) -> list[str]:
    """The files a compile read, from its `-MD` rule: workspace files relative to it, any other absolute."""
    body = make_rule.replace("\\\n", " ").split(":", 1)[-1]
    found = []
    for part in re.split(r"(?<!\\)\s+", body.strip()):
        path = (build_dir / part.replace("\\ ", " ").replace("\\#", "#").replace("$$", "$")).resolve()
        inside = path.is_relative_to(build_dir.resolve())
        found.append(str(path.relative_to(build_dir.resolve())) if inside else str(path))
    return sorted(set(found))


def _state(files: dict[str, bytes], read: list[str]) -> str:
    """A hash of what the files a compile read hold now: a unit's file by its content, any other by size and
    modification and change times (toolchain headers: thousands, unchanged), a missing one as missing."""
    h = hashlib.sha256()
    for name in read:
        if not os.path.isabs(name):
            seen = files[name] if name in files else b"<missing>"
        else:
            try:  # (the change time too: a modification time can be set back, `touch -r`, the change time not)
                st = os.stat(name)
                seen = f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}".encode()
            except OSError:
                seen = b"<missing>"
        h.update(name.encode() + b"\0" + hashlib.sha256(seen).digest())
    return h.hexdigest()[:32]


def compile_limits(address_space: bool = True) -> sandbox.Limits:
    """A compiler run's limits: its memory capped (the cgroup's, and with `address_space` its address space's, the
    one cap where no cgroup is; not for a run that imports torch, whose libraries reserve more than they use)."""
    return sandbox.Limits(memory_bytes=COMPILE_MEMORY_BYTES, cpu_seconds=None, address_space=address_space,
                          file_bytes=COMPILE_FILE_BYTES)


def _replace_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _run(cmd: list[str], cwd: Path, timeout: float | None = None) -> subprocess.CompletedProcess:
    timeout = COMPILE_TIMEOUT_S if timeout is None else timeout
    try:
        return sandbox.run_bounded(cmd, cwd, timeout, None)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, f"error: compiler timed out after {timeout:.0f}s")
    except OSError as exc:
        return subprocess.CompletedProcess(cmd, 127, f"error: cannot run {cmd[0]}: {exc}")


_ERROR_RE = re.compile(r"^.*\berror\b.*$", re.MULTILINE | re.IGNORECASE)


def _first_error(output: str) -> str:
    match = _ERROR_RE.search(output or "")
    return (match.group(0) if match else (output or "").strip().splitlines()[0] if output.strip() else "").strip()
