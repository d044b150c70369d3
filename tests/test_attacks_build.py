"""Red team (build and cache), 2026-12-05: attacks on the judge's builds that got through, each asserting the secure
behaviour (so each fails on the code it was found on)."""

import json
import os
import stat
from pathlib import Path

import pytest

from conftest import TASKS, fast_config
from cuda_agent import sandbox
from cuda_agent.judge import Judge
from cuda_agent.workspace import inline

AFFINE = TASKS / "affine_relu.py"
needs_sandbox = pytest.mark.skipif(sandbox.probe() is not None, reason=f"sandbox unavailable: {sandbox.probe()}")

# A single file whose load_inline passes an allowed `-L<torch's lib>` flag with newlines in it: torch writes
# extra_ldflags into build.ninja unquoted, so the lines after the first are ninja statements. They redefine `cxx` as
# a shell wrapper that, after linking, replaces the library with a symlink to TARGET. The judge, outside the
# sandbox, then hashes the "library", chmods it 0444 (follows the link) and copies it into the candidate's folder.
NINJA_SYMLINK = '''
import glob, os, pathlib
import torch
from torch.utils import cpp_extension
from torch.utils.cpp_extension import load_inline

SITE = str(pathlib.Path(cpp_extension.__file__).resolve().parents[2])
wrapper = ("sh -c 'c++ \\"$$@\\" && for f in *.so; do [ -f \\"$$f\\" ] && rm -f \\"$$f\\" && ln -s " + {target!r} +
           " \\"$$f\\"; done; true' sh")
flag = {flag_head!r} + SITE + "/torch/lib\\ncxx = " + wrapper + "\\nldflags = -shared"
leak = None
try:
    load_inline(name="pwn", cpp_sources=["int answer() {{ return 42; }}"], functions=["answer"],
                extra_ldflags=[flag])
except Exception as exc:
    found = glob.glob(os.path.join(os.getcwd(), "extensions", "*", "*.so"))
    leak = open(found[0], "rb").read().decode(errors="replace") if found else "no copy: %s" % exc
raise RuntimeError("LEAKED<<%s>>" % leak)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x
'''


@pytest.mark.parametrize("path", ["{site}/torch/lib\nrule pwn\n  command = touch /x\nbuild x: pwn\n",
                                  "{site}/torch/include\ncxx = sh -c 'id' sh\n", "{site}/torch/include dir"])
def test_load_inline_paths_with_newlines_or_spaces_are_refused(path):
    """Paths of extra_include_paths and `-L` flags are written into torch's build.ninja (the `-L` flags unquoted,
    the include paths in shell quotes, which ninja does not read): a newline starts a ninja statement of the
    candidate's own, which runs any command in the build's sandbox."""
    site = str(Path(inline._toolchain_dirs()[0]))
    path = path.format(site=site)
    for raw in ({"name": "x", "cpp_sources": ["int f();"], "extra_ldflags": ["-L" + path]},
                {"name": "x", "cpp_sources": ["int f();"], "extra_include_paths": [path]}):
        with pytest.raises(inline.InlineError):
            inline.normalise(raw)


@needs_sandbox
def test_a_load_inline_build_cannot_make_the_judge_read_or_chmod_a_host_file(visible_dir, visible_cache, tmp_path):
    """Held out (red team, 2026-12-05): the ninja injection above ran `ln -s /host/file out/<module>.so` inside the
    build's sandbox; the judge published the link (`os.replace`), chmodded its target 0444 and copied the target into
    the candidate's folder, where the candidate read it (a 0600 file of the host printed in the verdict; the file
    left world-readable)."""
    secret = visible_dir / "host-secret.txt"
    secret.write_text("HOST_SECRET_4242\n")
    secret.chmod(0o600)
    probe = tmp_path / "probe.py"
    probe.write_text(NINJA_SYMLINK.format(target=str(secret), flag_head="-L"))
    judge = Judge("cpu", fast_config(visible_cache, sandbox="required"))
    try:
        verdict = judge.evaluate(AFFINE, probe)
    finally:
        judge.close()
    assert "HOST_SECRET_4242" not in json.dumps(verdict.to_dict()), verdict.error
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600, oct(os.stat(secret).st_mode)
    for published in (visible_cache / "extensions").glob("*/*.so"):
        assert not published.is_symlink(), published


BURN = """constexpr unsigned long long burn(unsigned long long seed) {
    unsigned long long x = seed;
    for (int i = 0; i < 250000; ++i) { x = x * 6364136223846793005ULL + 1442695040888963407ULL; x ^= x >> 7; }
    return x;
}
"""


@needs_sandbox
def test_a_workspace_build_of_many_slow_units_stops_at_the_build_budget(visible_cache, make_workspace, monkeypatch):
    """Held out (red team, 2026-12-05): each unit's compile is stopped after COMPILE_TIMEOUT_S (600 s), but nothing
    bounds the workspace's build as a whole (`build_timeout_s`, documented as "one build (the workspace's
    objects...)", is never applied to it, nor `build_budget_s`): 255 kernel files each making g++ evaluate ~700
    constexpr calls within the default limits (~0.85 s each) hold the judge 255 / cores x 600 s (21 h on 2 cores).
    Scaled down here: units stopped after 3 s, a budget of 8 s, 8 units on the machine's cores."""
    from cuda_agent.workspace import build

    monkeypatch.setattr(build, "COMPILE_TIMEOUT_S", 3)
    ws = make_workspace()
    for i in range(8):
        body = "".join(f"constexpr unsigned long long v{j} = burn({i * 100 + j});\n" for j in range(40))
        (ws / "kernels" / f"slow{i}.cpp").write_text(BURN + body)
    judge = Judge("cpu", fast_config(visible_cache, sandbox="required", build_timeout_s=8,
                                     build_budget_s=8))
    judge.builder.jobs = 2
    try:
        verdict = judge.evaluate(AFFINE, ws)
    finally:
        judge.close()
    assert not verdict.compiled
    assert verdict.build["seconds"] <= 8 + 3, verdict.build["seconds"]


@needs_sandbox
def test_a_build_output_is_bounded_in_size_and_never_read_whole_into_the_judge(visible_cache, make_workspace):
    """Held out (red team, 2026-12-05): a kernel's `.fill` of 1 GiB (the assembler writes it in about a second, in
    27 MB of memory) was cached in the shared objects folder for good (objects have no size limit and the cache no
    eviction; a compile may write files of up to 32 GiB, one per unit: a few candidates fill the judge's disk, and
    every build after fails), and the judge read the linked library whole into its own memory for the symbol check
    (`symbols.dynamic_symbols`: `read_bytes`; `InlineBuilder.build` hashes `load_inline` libraries the same way)."""
    import resource

    ws = make_workspace()
    (ws / "kernels" / "big.cpp").write_text(
        'asm(".section .data.big,\\"aw\\",@progbits\\n.fill 1073741824,1,0x5a\\n.previous\\n");\n'
        'extern "C" int big_marker() { return 1; }\n')
    judge = Judge("cpu", fast_config(visible_cache, sandbox="required"))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    try:
        verdict = judge.evaluate(AFFINE, ws)
        grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
        largest = max((p.stat().st_size for p in (visible_cache / "build" / "objects").glob("*.o")), default=0)
    finally:
        judge.close()
    assert largest < 256 << 20 and grew < 256 << 20, \
        f"a {largest >> 20} MiB object cached, the judge's memory grew by {grew >> 20} MiB ({verdict.error})"


def _spam_source(doublings: int, width: int = 4000) -> str:
    """A kernel whose compile prints 2**doublings `#pragma message` notes of ~2 x width bytes each (g++ writes about
    100 MB of them a second: up to ~60 GB within one unit's 600 s)."""
    lines = [f'#define M0 _Pragma("message \\"{"X" * width}\\"")']
    lines += [f"#define M{i} M{i - 1} M{i - 1}" for i in range(1, doublings + 1)]
    return "\n".join(lines + [f"M{doublings}", 'extern "C" int spam_marker() { return 1; }', ""])


@needs_sandbox
def test_a_compilers_output_is_bounded_in_the_judges_memory(visible_cache, make_workspace):
    """Held out (red team, 2026-12-05): every compiler run's stdout+stderr is captured whole in the judge's process
    (`subprocess.run(stdout=PIPE, text=True)` in `sandbox.run`, then copied into the build log): a kernel of a
    few lines expanding `_Pragma("message ...")` 2**20 times prints ~9 GB in about 100 s, more than the judge's
    machine holds (here 2**16 times, ~600 MB)."""
    import resource

    ws = make_workspace()
    (ws / "kernels" / "spam.cpp").write_text(_spam_source(16))
    judge = Judge("cpu", fast_config(visible_cache, sandbox="required"))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    try:
        from cuda_agent.workspace.candidate import load_candidate
        result = judge.compile(load_candidate(ws))
    finally:
        judge.close()
    grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert grew < 256 << 20 and len(result.log) < 64 << 20, \
        f"the judge's memory grew by {grew >> 20} MiB; build log {len(result.log) >> 20} MiB"


def test_the_judge_never_follows_a_link_the_build_left_for_its_library(tmp_path, monkeypatch):
    """The second layer under the ninja injection: whatever runs in the build's sandbox may leave a link where the
    library should be; the judge must neither publish it nor chmod or copy what it points at."""
    secret = tmp_path / "host-secret.txt"
    secret.write_text("HOST_SECRET_4242\n")
    secret.chmod(0o600)
    builder = inline.InlineBuilder(tmp_path / "extensions", "identity", {}, confined=None)

    def run(work, timeout, hidden):
        module = json.loads((work / "request.json").read_text())["name"]
        (work / "out" / f"{module}.so").symlink_to(secret)
        return __import__("subprocess").CompletedProcess([], 0, "")

    monkeypatch.setattr(builder, "_run", run)
    try:
        built = builder.build({"name": "x", "cpp_sources": ["int f() { return 1; }"], "functions": ["f"]})
        published = built.path.read_text(errors="replace") if built.path.exists() else ""
    except RuntimeError:
        published = ""
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600
    assert "HOST_SECRET_4242" not in published


def _crafted_elf(kind: str) -> bytes:
    """Files the judge's ELF reader takes for an ELF64 LE shared object: `crash`, a symbol whose name lies beyond the
    file (ValueError); `hang`, 60,000 SHT_DYNSYM sections of entsize 1 over 1 MiB of zeros (days of Python loop)."""
    import struct

    head = bytearray(64)
    head[:6] = b"\x7fELF\x02\x01"
    if kind == "crash":
        body = struct.pack("<IBBHQQ", 0x7FFFFFF0, 0, 0, 0, 0, 0)
        sections = struct.pack("<IIQQQQIIQQ", 0, 11, 0, 0, 64, 24, 1, 0, 0, 24) + bytes(64)
        count = 2
    else:
        body, count = bytes((1 << 20) + 64), 60000
        sections = struct.pack("<IIQQQQIIQQ", 0, 11, 0, 0, 64, 1 << 20, 0, 0, 0, 1) * count
    struct.pack_into("<Q", head, 0x28, 64 + len(body))
    struct.pack_into("<HH", head, 0x3A, 64, count)
    return bytes(head) + body + sections


@pytest.mark.parametrize("kind", ["crash", "hang"])
def test_the_symbol_check_reports_a_malformed_library_and_never_raises_or_hangs(tmp_path, kind):
    """Held out (red team, 2026-12-05): with the ninja injection a candidate's `load_inline` library can be any file;
    the strict policy's symbol check (`library_problems`, in the judge's process) raised `ValueError: subsection not
    found` on `crash` (the evaluation ended in an exception, not a verdict: `cuda-agent eval` exit 2, an RL reward
    function's exception), and would loop for days on `hang`. A malformed table is a finding; the reader is bounded."""
    import threading
    from cuda_agent.judge.checks.symbols import library_problems

    lib = tmp_path / f"{kind}.so"
    lib.write_bytes(_crafted_elf(kind))
    result: list = []
    worker = threading.Thread(target=lambda: result.append(_call(library_problems, lib)), daemon=True)
    worker.start()
    worker.join(10)
    assert result, "the symbol check still runs after 10 s"
    assert not isinstance(result[0], Exception), repr(result[0])
    assert result[0], "a malformed library passes the symbol check"


def _call(fn, *args):
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - the test reports it
        return exc


EXTENSIONS_LINK = '''
import os
import torch
from torch.utils.cpp_extension import load_inline

os.symlink({target!r}, os.path.join(os.getcwd(), "extensions"))
ext = load_inline(name="plant", cpp_sources=["int answer() {{ return 42; }}"], functions=["answer"])


class ModelNew(torch.nn.Module):
    def __init__(self, *args):
        super().__init__()

    def forward(self, x):
        return ext.answer() * 0 + x
'''


@needs_sandbox
@pytest.mark.parametrize("exists", [True, False])
def test_the_judge_writes_a_load_inline_library_nowhere_the_candidate_points(visible_dir, visible_cache, tmp_path,
                                                                             exists):
    """Held out (red team, 2026-12-05): the judge copies each `load_inline` library into
    `<run>/candidate/extensions/<module>/`, a folder the candidate's own process writes. A candidate that made
    `extensions` a link first had the judge (outside the sandbox, as its user) create `<module>/<module>.so` in any
    folder (here one the candidate cannot write); a link to a folder that does not exist made `mkdir` raise
    FileExistsError out of `Judge.evaluate` (no verdict: `cuda-agent eval` printed a traceback, exit 1)."""
    target = visible_dir / ("planted" if exists else "missing")
    if exists:
        target.mkdir()
    probe = tmp_path / "probe.py"
    probe.write_text(EXTENSIONS_LINK.format(target=str(target)))
    judge = Judge("cpu", fast_config(visible_cache, sandbox="required"))
    try:
        verdict = judge.evaluate(AFFINE, probe)  # must end in a verdict, whatever the candidate did
    finally:
        judge.close()
    planted = list(target.rglob("*")) if target.exists() else []
    assert not planted and not (not exists and target.exists()), planted
    assert verdict.error is None or "Traceback" not in verdict.error


LOG_LINK = '''
import glob, os
for log in glob.glob(os.path.join(os.getcwd(), "*.log")):
    os.unlink(log)
    os.symlink({target!r}, log)
os._exit(3)


class ModelNew:
    pass
'''


@needs_sandbox
def test_the_judge_never_reads_a_host_file_through_the_candidates_log(visible_dir, visible_cache, tmp_path):
    """Held out (red team, 2026-12-05): a worker's log lies in the candidate's writable folder and the judge reads it
    again by its path for the verdict's last line when the worker exits (`BoundedLog.tail`): a candidate that
    replaced it with a link to a 0600 host file (or `/proc/self/environ`: the judge's own environment) and exited
    had that file's last line printed in its verdict."""
    secret = visible_dir / "host-secret-log.txt"
    secret.write_text("HOST_SECRET_LOG_4242\n")
    secret.chmod(0o600)
    probe = tmp_path / "probe.py"
    probe.write_text(LOG_LINK.format(target=str(secret)))
    judge = Judge("cpu", fast_config(visible_cache, sandbox="required"))
    try:
        verdict = judge.evaluate(AFFINE, probe)
    finally:
        judge.close()
    # (since 2026-12-06 the candidate's folder is only read: the link is refused before it can be made)
    assert "exited with code 3" in verdict.error or "Read-only file system" in verdict.error, verdict.error
    assert "HOST_SECRET_LOG_4242" not in json.dumps(verdict.to_dict()), verdict.error
