"""`load_inline` for candidates, built by the judge: content-addressed, compiled in the sandbox, published read-only.

A candidate's `load_inline(...)` (KernelBench single files; any `model_new.py` may call it) never builds in the
candidate's process. The worker sends the call's arguments to the judge (`request_from_call`), which validates
them (`normalise`: sources as text, compiler and linker flags from an allowlist, no paths outside the toolchain),
builds them with torch's own `load_inline` in a sandbox that may write only a private folder (`main`, which stops
before importing the module; machine code for the judge's GPU added when the flags name only older ones:
`machine_code_flags`), and publishes the library under a key of the arguments and the toolchain, where
every candidate may read it and none may write. The worker loads it after checking its SHA-256 (`load_published`).
So no candidate can plant a file in another's build, and an unchanged source is never rebuilt.

Helper usage (by the judge, inside the sandbox): python -m cuda_agent.workspace.inline REQUEST.json OUT_DIR
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cache_budget import touch

LIST_FIELDS = ("cpp_sources", "cuda_sources", "extra_cflags", "extra_cuda_cflags", "extra_ldflags",
               "extra_include_paths")
BOOL_FIELDS = ("with_cuda", "is_python_module", "with_pytorch_error_handling", "no_implicit_headers")
IGNORED = ("verbose", "build_directory", "keep_intermediates", "use_pch")  # the judge decides these
_HOST_FLAG = re.compile(
    r"-O[0-3sgz]?|-Ofast|-std=(c|gnu)\+\+\w+|-[DU]\w+(=[\w.+\-]*)?|-march=native|-mtune=native|-m[a-z0-9\-]+"
    r"|-f[a-z0-9\-]+(=[\w\-]+)?|-w|-W(?![lap],)[\w=+\-]*|-g[0-3]?|-pthread|-fopenmp|-fPIC|-pedantic")
_CUDA_FLAG = re.compile(
    r"-O[0-3]|-?-use_fast_math|--expt-relaxed-constexpr|--expt-extended-lambda|-lineinfo|-std=c\+\+\w+"
    r"|-[DU]\w+(=[\w.+\-]*)?|--?maxrregcount[= ]?\d+|-Xptxas=?[\w,=\-]*|--ptxas-options=[\w,=\-]+|-res-usage"
    r"|--resource-usage|--extra-device-vectorization|-?-restrict|--(ftz|prec-div|prec-sqrt|fmad)=(true|false)"
    r"|-w|-Wno-[\w\-]+|--diag-suppress=[\d,]+|-arch=sm_\d+a?|-gencode=arch=compute_\d+a?,code=(sm|compute)_\d+a?"
    r"|--threads=?\d+|-t\d+|-Xcompiler=[\w,=+.\-]+")
_LD_FLAG = re.compile(r"-l(cublas|cublasLt|cudnn|cuda|cudart|gomp|pthread|m|dl)|-fopenmp|-pthread")


class InlineError(ValueError):
    """The load_inline call cannot be built as asked (a bad argument, a flag outside the allowlist)."""


def request_from_call(arguments: dict[str, Any]) -> dict[str, Any]:
    """The JSON-able request for a load_inline call's bound arguments (the worker's side)."""
    req = {k: v for k, v in arguments.items() if k not in IGNORED}
    if isinstance(req.get("functions"), str):
        req["functions"] = [req["functions"]]
    return json.loads(json.dumps(req, default=str))


_PTXAS_OPTION = re.compile(r"-?-?[\w=\-]+")
# Flags that load or write other files, or lift the compiler's limits (a constexpr evaluation of hours)
_FORBIDDEN = ("-fplugin", "-fprofile", "-fauto-profile", "-specs", "-wrapper", "-B", "-fconstexpr", "-ftemplate-depth",
              "-fmax-include-depth", "-fmax-errors")


def _toolchain_dirs() -> list[str]:
    from torch.utils import cpp_extension

    dirs = [str(Path(cpp_extension.__file__).resolve().parents[2])]  # torch/ (headers and libraries)
    if cpp_extension.CUDA_HOME:
        dirs.append(str(Path(cpp_extension.CUDA_HOME).resolve()))
    return dirs


_PATH = re.compile(r"/[\w./+\-]*")  # torch writes these paths into build.ninja (`-L` unquoted): no space, no newline


def _check_paths(paths: list[str], what: str) -> None:
    toolchain = _toolchain_dirs()
    for path in paths:
        if not _PATH.fullmatch(path) or not os.path.isdir(path):  # (a newline starts a ninja statement: red team)
            raise InlineError(f"load_inline: {what} must be existing folders of torch or CUDA, not {path!r}")
        real = str(Path(path).resolve())
        if not any(real == d or real.startswith(d + "/") for d in toolchain):
            raise InlineError(f"load_inline: {what} may only name folders of torch or CUDA, not {path!r}")


def _check_value(value: str, value_of: re.Pattern, what: str) -> None:
    """The value of `-Xcompiler X`, `-Xcompiler=X`, `-Xptxas X`...: each comma-separated flag passed on."""
    if not all(value_of.fullmatch(part) and not part.startswith(_FORBIDDEN) for part in value.split(",")):
        raise InlineError(f"load_inline: {what} value {value!r} is not allowed")


def _check_flags(flags: list[str], pattern: re.Pattern, what: str) -> None:
    value_of: re.Pattern | None = None
    passed_on = {"-Xcompiler": _HOST_FLAG, "-Xptxas": _PTXAS_OPTION, "--ptxas-options": _PTXAS_OPTION}
    for flag in flags:
        name, _, value = flag.partition("=")
        if value_of is not None:
            _check_value(flag, value_of, what)
            value_of = None
        elif what == "extra_cuda_cflags" and flag in passed_on:
            value_of = passed_on[flag]
        elif what == "extra_cuda_cflags" and name in passed_on and value:
            _check_value(value, passed_on[name], what)
        elif what == "extra_ldflags" and flag.startswith("-L"):
            _check_paths([flag[2:]], what)
        elif not pattern.fullmatch(flag) or flag.startswith(_FORBIDDEN):
            raise InlineError(f"load_inline: {what} flag {flag!r} is not allowed (optimisation, language, macro "
                              "and warning flags are; so are -lcublas, -lcublasLt, -lcudnn)")


def normalise(raw: Any) -> dict[str, Any]:
    """Validate a request (it comes from the candidate's process) into load_inline's keyword arguments."""
    if not isinstance(raw, dict):
        raise InlineError("load_inline: malformed request")
    unknown = set(raw) - {"name", "functions", *LIST_FIELDS, *BOOL_FIELDS}
    if unknown - {"sycl_sources", "extra_sycl_cflags", "with_sycl"}:
        raise InlineError(f"load_inline: unsupported arguments {sorted(unknown)}")
    if any(raw.get(k) for k in ("sycl_sources", "extra_sycl_cflags", "with_sycl")):
        raise InlineError("load_inline: SYCL sources are not supported")
    name = raw.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_]\w{0,63}", name):
        raise InlineError(f"load_inline: name must be a C identifier, not {name!r}")
    req: dict[str, Any] = {"name": name}
    for key in LIST_FIELDS:
        value = raw.get(key)
        value = [] if value is None else [value] if isinstance(value, str) else value
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InlineError(f"load_inline: {key} must be a string or a list of strings")
        # an empty flag ("" in a list, as some published solutions have) is no flag: the compiler never sees it
        req[key] = value if key.endswith("sources") else [v for v in value if v.strip()]
    functions = raw.get("functions")
    if functions is not None and not (isinstance(functions, list) and all(isinstance(f, str) for f in functions)
                                      or isinstance(functions, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                                             for k, v in functions.items())):
        raise InlineError("load_inline: functions must be a name, a list of names or a dict of docstrings")
    if functions is not None:
        names = functions if isinstance(functions, list) else list(functions)
        if not all(re.fullmatch(r"[A-Za-z_][\w:]*", f) for f in names):
            raise InlineError("load_inline: functions must be C++ function names")
        if isinstance(functions, dict) and any('"' in v or "\\" in v or "\n" in v for v in functions.values()):
            raise InlineError("load_inline: docstrings may not contain quotes, backslashes or newlines")
    req["functions"] = functions
    for key in BOOL_FIELDS:
        value = raw.get(key)
        if value is not None and not isinstance(value, bool):
            raise InlineError(f"load_inline: {key} must be a boolean")
        if value is not None:
            req[key] = value
    _check_flags(req["extra_cflags"], _HOST_FLAG, "extra_cflags")
    _check_flags(req["extra_cuda_cflags"], _CUDA_FLAG, "extra_cuda_cflags")
    _check_flags(req["extra_ldflags"], _LD_FLAG, "extra_ldflags")
    _check_paths(req["extra_include_paths"], "extra_include_paths")
    return req


_ARCH = re.compile(r"-arch=sm_(\d+)(a?)")
_GENCODE = re.compile(r"-gencode=arch=compute_(\d+)(a?),code=(sm|compute)_(\d+)(a?)")


def machine_code_flags(cuda_flags: list[str], target: str) -> list[str]:
    """nvcc flags to add so that the library holds machine code for the judge's GPU (`target`, e.g. '90a').

    A candidate that names older GPUs (`-arch=sm_80`) ships their machine code and their PTX; on the judge's GPU the
    driver must then compile that PTX when the library loads, at every evaluation (a fresh sandbox has no JIT
    cache: seconds to minutes of `candidate_load`). Compiling the newest usable PTX for the target here gives what
    the driver would have built. Nothing is added when runnable machine code is there already, or when no PTX is
    (such a library does not run on this GPU, here as anywhere)."""
    digits = target.rstrip("a")
    major, minor = int(digits[:-1]), int(digits[-1])
    runnable, ptx = False, []
    for flag in cuda_flags:
        arch = _ARCH.fullmatch(flag)
        gencode = _GENCODE.fullmatch(flag)
        if arch:
            sass = virtual = (arch[1], arch[2])  # -arch=sm_XY: machine code for XY and PTX of compute_XY
        elif gencode:
            virtual = (gencode[1], gencode[2])
            sass = (gencode[4], gencode[5]) if gencode[3] == "sm" else None
            if gencode[3] == "compute":
                ptx.append(virtual)
        else:
            continue
        if arch:
            ptx.append(virtual)
        if sass and (sass == (digits, target[len(digits):]) or not sass[1] and int(sass[0][:-1]) == major
                     and int(sass[0][-1]) <= minor):
            runnable = True
    usable = [int(v) for v, specific in ptx if not specific and int(v) <= int(digits)]
    if runnable or not usable:
        return []
    return [f"-gencode=arch=compute_{max(usable)},code=sm_{digits}"]


@dataclass
class Built:
    path: Path  # the published library
    module: str  # the name it was built (and must be imported) under
    sha256: str
    cached: bool
    seconds: float
    log: str = ""


class InlineBuilder:
    """Builds and publishes candidates' load_inline calls under `root` (the judge's `extensions` folder)."""

    def __init__(self, root: Path, identity: str, env: dict[str, str], confined: list[Path] | None,
                 timeout: float = 900.0, arch: str = ""):
        """`arch`: the GPU the libraries run on (nvcc's spelling, '90a'); '' on the cpu backend."""
        self.root, self.identity, self.env, self.confined = Path(root), identity, env, confined
        self.timeout, self.arch = timeout, arch
        self.root.mkdir(parents=True, exist_ok=True)

    def key(self, req: dict[str, Any]) -> str:
        return hashlib.sha256((self.identity + "\0" + json.dumps(req, sort_keys=True)).encode()).hexdigest()

    def build(self, raw: Any, origin: tuple[str, str] = ("", ""), timeout: float | None = None,
              hidden: list[Path] = ()) -> Built:
        """Raises InlineError (bad request) or RuntimeError (the compiler's error, with its log). `origin`: the
        candidate's file (name, text), to place the compiler's errors on its lines. `timeout`: seconds the build may
        take (default: the builder's). `hidden`: more paths its compiler must not see (the candidate's own folder:
        the published library is keyed by the request alone, so nothing a candidate wrote may reach it)."""
        start = time.perf_counter()
        req = normalise(raw)
        if self.arch and req["cuda_sources"]:
            req["extra_cuda_cflags"] += machine_code_flags(req["extra_cuda_cflags"], self.arch)
        key = self.key(req)
        module = f"{req['name']}_{key[:16]}"
        published = self.root / key
        library = published / f"{module}.so"
        with open(self.root / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if (published / "sha256").is_file() and library.is_file():
                touch(published)  # (its last use: the cache's budget removes the least recently used)
                return Built(library, module, (published / "sha256").read_text().strip(), True,
                             time.perf_counter() - start)
            work = Path(tempfile.mkdtemp(prefix=".build-", dir=self.root))
            try:
                (work / "out").mkdir()
                (work / "request.json").write_text(json.dumps({**req, "name": module}))
                proc = self._run(work, self.timeout if timeout is None else timeout, hidden)
                built = work / "out" / f"{module}.so"
                if proc.returncode != 0 or not built.is_file():
                    failed = self.root / "failed" / f"{module}.log"
                    failed.parent.mkdir(exist_ok=True)
                    failed.write_text(proc.stdout)
                    raise RuntimeError(_diagnostics(proc.stdout, _generated(work / "out", req), origin)
                                       + f"\n[exit code {proc.returncode}; the compiler's whole log: {failed}]")
                shutil.rmtree(published, ignore_errors=True)
                published.mkdir()
                digest = _copy_out(built, library)  # the sandbox's file, never followed nor moved
                library.chmod(0o444)
                (published / "build.log").write_text(proc.stdout[-200_000:])
                (published / "sha256").write_text(digest)
                return Built(library, module, digest, False, time.perf_counter() - start, proc.stdout[-20_000:])
            finally:
                shutil.rmtree(work, ignore_errors=True)

    def _run(self, work: Path, timeout: float, hidden: list[Path]) -> subprocess.CompletedProcess:
        from .. import sandbox
        from .build import compile_limits

        cmd = [sys.executable, "-m", "cuda_agent.workspace.inline", str(work / "request.json"), str(work / "out")]
        env = {**sandbox.public_environ(), **self.env, "HOME": "/tmp", "TMPDIR": "/tmp",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]),
                                                          os.environ.get("PYTHONPATH")]))}
        try:
            if self.confined is None:
                return subprocess.run(cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, errors="replace", timeout=timeout)
            view = sandbox.View(writable=[work], hidden=[*self.confined, *hidden])
            return sandbox.run(cmd, view, work, timeout, compile_limits(address_space=False), env=env)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(cmd, 124, f"error: the build timed out after {timeout:.0f}s")


MAX_LIBRARY_BYTES = 1 << 30


def _open_own(path: Path, limit: int = MAX_LIBRARY_BYTES) -> int:
    """A file the sandboxed build wrote, opened without following a link (held out, red team 2026-12-05: an
    injected command replaced the library by a link to a host file, which the judge chmodded and copied to the
    candidate): a regular file of at most `limit` bytes, or RuntimeError."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise RuntimeError(f"load_inline: the build's {path.name} cannot be read: {exc}") from exc
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
        os.close(fd)
        raise RuntimeError(f"load_inline: the build's {path.name} is not a regular file of at most {limit} bytes")
    return fd


def _copy_out(built: Path, dest: Path) -> str:
    """Copy the build's library into a file of the judge's own, streaming; its SHA-256."""
    h = hashlib.sha256()
    with os.fdopen(_open_own(built), "rb") as src, open(dest, "xb") as out:
        while chunk := src.read(1 << 20):
            h.update(chunk)
            out.write(chunk)
    return h.hexdigest()


# a compiler's diagnostic: gcc/clang "file:line:col: error: ...", nvcc "file(line): error: ..."
DIAGNOSTIC = re.compile(r"^(?P<path>[^\s:()]+)(?::(?P<line>\d+)(?::\d+)?:|\((?P<nvline>\d+)\):) "
                        r"(?P<message>(?:fatal )?error\b.*)$", re.IGNORECASE)


def _generated(out: Path, req: dict[str, Any]) -> dict[str, tuple[str, list[str], str]]:
    """The files load_inline generated (main.cpp, cuda.cu): the request's field, its sources, the file's text."""
    found = {}
    for name, field in (("main.cpp", "cpp_sources"), ("cuda.cu", "cuda_sources")):
        if (out / name).is_file() and req.get(field):
            try:
                with os.fdopen(_open_own(out / name, 64 << 20), "rb") as f:
                    found[name] = (field, list(req[field]), f.read().decode(errors="replace"))
            except RuntimeError:
                continue
    return found


def _where(name: str, line: int, generated: dict, origin: tuple[str, str]) -> str:
    """`line` of a generated file as the candidate wrote it: FILE line n (cpp_sources[i] line k) when the source is
    in the candidate's file verbatim, else cpp_sources[i] line k, or the part load_inline generated."""
    field, sources, text = generated[name]
    start = 0
    for i, source in enumerate(sources):
        at = text.find(source, start)
        if at < 0:
            break
        first = text.count("\n", 0, at) + 1
        if first <= line < first + source.count("\n") + 1:
            label = f"{field if len(sources) == 1 else f'{field}[{i}]'} line {line - first + 1}"
            found = origin[1].find(source) if source.strip() else -1
            if found < 0:
                return label
            return f"{origin[0]} line {origin[1].count(chr(10), 0, found) + 1 + line - first} ({label})"
        start = at + len(source)
    return f"{name} line {line} (written by load_inline around your sources)"


def _diagnostics(log: str, generated: dict | None = None, origin: tuple[str, str] = ("", ""),
                 lines: int = 12) -> str:
    """The compiler's first error lines, each placed in the candidate's own sources (cpp_sources line 12: error:
    ...), else lines that mention an error (never the compiler's command lines), else the log's end."""
    generated = generated or {}
    found = []
    for raw in log.splitlines():
        m = DIAGNOSTIC.match(raw.strip())
        if m:
            name, line = Path(m["path"]).name, int(m["line"] or m["nvline"])
            where = _where(name, line, generated, origin) if name in generated else f"{name}:{line}"
            found.append(f"{where}: {m['message']}")
    if not found:
        found = [ln.strip() for ln in log.splitlines() if re.search(r"\berror\b", ln, re.IGNORECASE)
                 and len(ln) < 500 and not ln.lstrip().startswith(("FAILED:", "ninja:", "RuntimeError", "subprocess"))]
    return "\n".join(found[:lines]) if found else "\n".join(log.strip().splitlines()[-lines:])


def load_published(path: Path, module: str, sha256: str, is_python_module: bool = True):
    """Import a library the judge published, after checking that it is the one the judge built."""
    import importlib.util

    import torch

    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    if digest != sha256:
        raise RuntimeError(f"extension {path} does not match what the judge built (sha256 {digest[:12]} != "
                           f"{sha256[:12]})")
    if not is_python_module:
        torch.ops.load_library(str(path))
        return str(path)
    spec = importlib.util.spec_from_file_location(module, path)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def main() -> None:
    """Build one request with torch's load_inline into OUT_DIR, stopping before the import (no candidate code runs
    here: only compilers)."""
    from torch.utils import cpp_extension

    req, out = json.loads(Path(sys.argv[1]).read_text()), sys.argv[2]
    cpp_extension._import_module_from_library = lambda name, path, is_python_module: os.path.join(path, name)
    try:
        cpp_extension.load_inline(**req, build_directory=out, verbose=True)
    except Exception as exc:  # the compiler's output is in the exception (ninja's log)
        print(exc, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
