"""The candidate's sandbox: each barrier holds inside, and (where it makes sense) the same probe gets through from
a plain process, so the test would fail without the barrier."""

import errno
import json
import os
import socket
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from conftest import TASKS, fast_config, kept_processes, not_another_workers
from cuda_agent import sandbox
from cuda_agent.judge import Judge
from cuda_agent.sandbox.cgroup import Cgroup, members
from cuda_agent.workspace import build
from cuda_agent.workspace.candidate import load_candidate

AFFINE = TASKS / "affine_relu.py"
pytestmark = pytest.mark.skipif(sandbox.probe() is not None, reason=f"sandbox unavailable: {sandbox.probe()}")


def candidate(folder: Path, init_body: str, forward_body: str) -> Path:
    path = folder / "probe.py"
    path.write_text("import ctypes, errno, json, os, socket, subprocess\nimport torch\n\n\n"
                    "class ModelNew(torch.nn.Module):\n"
                    f"    def __init__(self, scale, shift):\n        super().__init__()\n        {init_body}\n\n"
                    f"    def forward(self, x):\n        {forward_body}\n")
    return path


@pytest.fixture(scope="module")
def judges(visible_cache):
    """Sandboxed and plain judges whose cache lies outside /tmp (which the sandbox replaces anyway)."""
    return {mode: Judge("cpu", fast_config(visible_cache, sandbox=mode, memory_limit_gb=8, max_processes=256))
            for mode in ("required", "none")}


def test_network_is_unreachable_inside(judges, tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    probe = candidate(tmp_path, "pass",
                      f"raise RuntimeError('connect=%d' % socket.socket().connect_ex(('127.0.0.1', {port})))")
    try:
        inside = judges["required"].evaluate(AFFINE, probe)
        outside = judges["none"].evaluate(AFFINE, probe)
    finally:
        server.close()
    assert inside.sandbox.startswith("namespaces") and outside.sandbox.startswith("none")
    assert "connect=0" in outside.error  # the same probe reaches the server from a plain process
    assert "connect=" in inside.error and "connect=0" not in inside.error, inside.error


@contextmanager
def processes_allowed_while_loading(*judged):
    """The kernelbench policy, whose candidates may start processes while they load (strict refuses them from the
    start since 2026-12-06): what the sandbox alone does with them."""
    for judge in judged:
        judge.config.policy = "kernelbench"
    try:
        yield
    finally:
        for judge in judged:
            judge.config.policy = "strict"


def test_no_process_outlives_the_evaluation(judges, tmp_path):
    marker = "987654"  # sleep's argument identifies the stray process
    probe = candidate(tmp_path, f"subprocess.Popen(['sleep', '{marker}'], start_new_session=True)", "return x * 1")

    def strays() -> list[str]:
        return subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True).stdout.split()

    try:
        with processes_allowed_while_loading(*judges.values()):
            judges["required"].evaluate(AFFINE, probe)
            assert strays() == []
            judges["none"].evaluate(AFFINE, probe)  # a daemon that left the session survives a plain process
            assert strays() != []
    finally:
        subprocess.run(["pkill", "-f", f"sleep {marker}"])


def test_memory_is_bounded_inside(judges, tmp_path):
    probe = candidate(tmp_path, "pass", "self.hog = bytearray(10 * 2**30)")  # 10 GiB, over the 8 GiB limit
    verdict = judges["required"].evaluate(AFFINE, probe)
    assert "address space <= 8.0 GiB" in verdict.sandbox
    assert verdict.reward == -1 and "MemoryError" in verdict.error, verdict.error


FS_PROBE = """
        r = {}
        def attempt(name, fn):
            try:
                r[name] = fn()
            except OSError as exc:
                r[name] = errno.errorcode.get(exc.errno, str(exc.errno))
        def libc_call(fn):
            return 'ok' if fn() == 0 else errno.errorcode.get(ctypes.get_errno(), '?')
        attempt('write_outside', lambda: open(%(outside)r, 'w').write('pwned'))
        attempt('read_judge_db', lambda: len(open(%(db)r, 'rb').read()))
        attempt('list_runs', lambda: os.listdir(%(runs)r))
        libc = ctypes.CDLL(None, use_errno=True)
        attempt('cache_mounted', lambda: %(cache)r in open('/proc/self/mountinfo').read().split())
        attempt('umount_hidden', lambda: libc_call(lambda: libc.umount2(%(cache)r.encode(), 2)))
        attempt('remount_rw', lambda: libc_call(lambda: libc.mount(None, b'/', None, 32 | 4096, None)))
        attempt('db_after_umount', lambda: len(open(%(db)r, 'rb').read()))
        attempt('write_tmp', lambda: open('/tmp/scratch', 'w').write('ok'))
        attempt('signal_judge', lambda: os.kill(%(judge_pid)d, 0))
        raise RuntimeError('FS=' + json.dumps(r))"""


def _fs_results(verdict) -> dict:
    assert verdict.error and "FS=" in verdict.error, verdict.error
    # the probe's JSON, then where the candidate raised it (`(at model_new.py:N in forward ...)`)
    return json.JSONDecoder().raw_decode(verdict.error.split("FS=", 1)[1].strip())[0]


def test_filesystem_view_hides_judge_data_and_is_read_only(judges, visible_dir, tmp_path):
    cache = judges["required"].cache_dir
    outside = visible_dir / "outside.txt"  # a folder the candidate sees as it is: only the view can deny the write
    assert (cache / "judge.sqlite").exists() and not str(cache).startswith("/tmp")
    body = FS_PROBE % {"outside": str(outside), "db": str(cache / "judge.sqlite"), "runs": str(cache / "runs"),
                       "cache": str(cache), "judge_pid": os.getpid()}
    # in __init__: after it the seccomp filter refuses mounts itself (EPERM), before it only the lock holds them
    probe = candidate(tmp_path, body.strip(), "pass")
    inside = _fs_results(judges["required"].evaluate(AFFINE, probe))
    assert not outside.exists(), "the sandboxed candidate wrote outside its folders"
    assert inside["write_outside"] == "EROFS", inside  # the file system is there, but read-only
    assert inside["read_judge_db"] == "ENOENT" and inside["db_after_umount"] == "ENOENT", inside  # covered
    assert len(inside["list_runs"]) <= 1  # its own run folder at most: the judge's other runs are unseen
    # The view holds: the cover over the cache is a mount point, yet the command (in a user namespace below the one
    # that owns its mounts, where they are locked besides: mount_namespaces(7)) has no right to unmount it, nor to
    # remount / writable.
    assert inside["cache_mounted"] is True and inside["umount_hidden"] == "EPERM", inside
    assert inside["remount_rw"] == "EPERM", inside
    assert inside["write_tmp"] == 2  # a private /tmp is writable
    assert inside["signal_judge"] == "ESRCH"  # the judge's processes are not even addressable
    plain = _fs_results(judges["none"].evaluate(AFFINE, probe))  # the same probe gets through without it
    assert plain["write_outside"] == 5 and outside.read_text() == "pwned"
    assert isinstance(plain["read_judge_db"], int) and plain["signal_judge"] is None
    assert len(plain["list_runs"]) >= 1


@pytest.mark.skipif(Cgroup.layout() is None and os.geteuid() == 0,
                    reason="no writable cgroup and running as root: nothing would stop a fork bomb")
def test_fork_bomb_is_contained(judges, tmp_path):
    bomb = candidate(tmp_path, "[os.fork() for _ in range(64)]", "return x * 1")
    start = time.monotonic()
    with processes_allowed_while_loading(judges["required"]):
        verdict = judges["required"].evaluate(AFFINE, bomb)
    assert time.monotonic() - start < 120
    assert verdict.reward == -1 and verdict.error, verdict.error
    assert "process limit reached" in verdict.error or "Resource temporarily unavailable" in verdict.error, \
        verdict.error
    # candidate workers of this judge (other tests' judges keep spares of their own), but for its spares
    pattern = f"candidate_worker {judges['required'].cache_dir}"
    left = not_another_workers(set(subprocess.run(["pgrep", "-f", pattern], capture_output=True,
                                                  text=True).stdout.split()))
    assert left <= kept_processes(*judges.values()), "fork bomb processes survived the evaluation"


def test_sandbox_unit_describes_and_cleans_up(tmp_path):
    box = sandbox.Sandbox(sandbox.View(writable=[tmp_path]), sandbox.Limits(max_processes=64, memory_bytes=1 << 30),
                          cwd=tmp_path)
    try:
        run = subprocess.run([*box.prefix(), "sh", "-c", "pwd; touch ok; echo > /dev/null && echo devnull"],
                             capture_output=True, text=True, timeout=60)
    finally:
        box.close()
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [str(tmp_path), "devnull"] and (tmp_path / "ok").exists()
    assert "namespaces: user, net, ipc, pid, mount" in box.describe()


def test_system_v_shared_memory_made_inside_goes_with_the_sandbox(tmp_path):
    """Held out (red team, 2026-12-05): without an IPC namespace a candidate's System V segment (64 MiB made in
    `__init__`) outlived its evaluation, held by no cgroup, and the next candidate could read it."""
    key = 0x5CA0000 + os.getpid() % 0xFFFF
    make = ("import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
            f"print(libc.shmget({key}, 1 << 20, 0o1000 | 0o600))")  # IPC_CREAT
    box = sandbox.Sandbox(sandbox.View(writable=[tmp_path]), sandbox.Limits(max_processes=64), cwd=tmp_path)
    try:
        run = subprocess.run([*box.prefix(), sys.executable, "-c", make], capture_output=True, text=True, timeout=60)
    finally:
        box.close()
    assert run.returncode == 0 and int(run.stdout) >= 0, (run.stdout, run.stderr)  # made, inside
    keys = [int(line.split()[0]) for line in open("/proc/sysvipc/shm").read().splitlines()[1:] if line.split()]
    assert key not in keys, "the sandbox's System V segment is the host's"
    if box.cgroup:
        assert all(not d.exists() for d in box.cgroup.dirs), "cgroup left behind"


def test_a_process_moved_into_a_subgroup_is_still_the_group_s_and_dies_with_it():
    """Held out (red team, 2026-12-04): a helper process that mounted a cgroup in a namespace of its own and moved into
    a subgroup left the group's `cgroup.procs`, which was all the trusted side read between calls; the group's
    removal then failed on the subgroup and left both behind."""
    group = Cgroup.create(64, 1 << 30)
    if group is None:
        pytest.skip("no writable cgroup hierarchy here")
    helper = subprocess.Popen(["sleep", "60"])
    try:
        hidden = group.dirs[0] / "h"
        hidden.mkdir()
        (hidden / "cgroup.procs").write_text(str(helper.pid))
        assert str(helper.pid) not in (group.dirs[0] / "cgroup.procs").read_text().split()
        assert members(group.dirs[0]) == [helper.pid]
        group.close()
        assert helper.wait(timeout=10) == -9 and not any(d.exists() for d in group.dirs)
    finally:
        helper.kill()


def test_a_writable_folder_inside_a_hidden_one_inside_a_readable_one_stays_writable(tmp_path):
    """`python -m cuda_agent eval --cache-dir cache` run from the folder holding `cache` failed every build with
    "Read-only file system": the working folder (on sys.path, bound back read-only) was mounted after the build's
    writable folder inside it, and the cache's cover too. Mounts now go in the order of their depth."""
    objects = tmp_path / "cache" / "build" / "objects"
    objects.mkdir(parents=True)
    (tmp_path / "cache" / "judge.sqlite").write_text("secret")
    box = sandbox.Sandbox(sandbox.View(writable=[objects], readable=[tmp_path], hidden=[tmp_path / "cache"]),
                          sandbox.Limits(max_processes=64), cwd=tmp_path)
    try:
        run = subprocess.run([*box.prefix(), "sh", "-c", f"touch {objects}/ok && ls {tmp_path / 'cache'}; "
                              f"touch {tmp_path}/no || echo read-only"], capture_output=True, text=True, timeout=60)
    finally:
        box.close()
    assert run.stdout.split() == ["build", "read-only"], (run.stdout, run.stderr)
    assert (objects / "ok").exists() and not (tmp_path / "no").exists()


def test_a_hidden_folder_inside_another_inside_a_readable_one_builds_a_view(tmp_path):
    """Found by a red team (2026-12-05): `train eval --out` under a script's folder (on sys.path, bound back): the
    episodes folder (concealed) and an episode's workspace inside it (a compile's candidate origin) were both
    covered, the inner one inside the outer's empty cover, where its mount point does not exist: every view failed
    ("No such file or directory") and every candidate got -1. Only hidden paths that would show are covered."""
    workspace, unit = tmp_path / "out" / "episodes" / "a" / "workspace", tmp_path / "unit"
    workspace.mkdir(parents=True)
    (workspace / "model_new.py").write_text("secret")
    (tmp_path / "out" / "episodes" / "note.txt").write_text("secret")
    unit.mkdir()
    hidden = [tmp_path / "out" / "episodes", workspace, workspace / "model_new.py", tmp_path / "out" / "episodes" /
              "note.txt"]
    box = sandbox.Sandbox(sandbox.View(writable=[unit], readable=[tmp_path], hidden=hidden),
                          sandbox.Limits(max_processes=64), cwd=unit)
    try:
        script = f"ls -A {tmp_path / 'out' / 'episodes'} | wc -l; ls {tmp_path}"
        run = subprocess.run([*box.prefix(), "sh", "-c", script], capture_output=True, text=True, timeout=60)
    finally:
        box.close()
    assert run.returncode == 0 and run.stdout.split() == ["0", "out", "unit"], (run.stdout, run.stderr)


def shell_in_sandbox(script: str, writable: Path) -> subprocess.CompletedProcess:
    """`sh -c script` in a sandbox that may write only `writable`, then a check that Python imports there."""
    box = sandbox.Sandbox(sandbox.View(writable=[writable]), sandbox.Limits(max_processes=64), cwd=writable)
    try:
        return subprocess.run([*box.prefix(), "sh", "-c", f"{script}; {sys.executable} -c "
                               "'import torch, cuda_agent; print(\"py-ok\")'"], capture_output=True, text=True,
                              timeout=120)
    finally:
        box.close()


def test_home_directories_and_password_hashes_are_hidden_but_python_works(tmp_path):
    secret_dir = Path.home()
    run = shell_in_sandbox(f"ls -A {secret_dir} | wc -l; wc -c < /etc/shadow", tmp_path)
    assert run.returncode == 0, run.stderr
    visible, shadow, py = run.stdout.split()
    outside = len([p for p in secret_dir.iterdir()])
    assert int(visible) < outside or outside == 0  # only what Python needs is bound back
    assert shadow == "0" and py == "py-ok"


def test_a_script_folder_on_sys_path_does_not_bring_the_hosts_tmp_back(tmp_path, monkeypatch):
    """A judge run from a script in /tmp (or by a Ray worker, which adds the driver's folder to sys.path) once bound
    the whole host /tmp back read-only: candidates saw the judge's cache there and could not write their own /tmp."""
    marker = Path(tempfile.mkdtemp(dir="/tmp")) / "host-secret"
    marker.write_text("x")
    monkeypatch.setattr(sys, "path", ["/tmp", *sys.path])
    try:
        run = shell_in_sandbox(f"touch /tmp/mine && echo wrote; ls {marker} 2>&1", tmp_path)
    finally:
        shutil.rmtree(marker.parent)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("wrote\n") and "No such file" in run.stdout and "py-ok" in run.stdout, run.stdout


def test_a_candidate_sees_no_published_extension_but_its_own(cache_dir, tmp_path):
    """Libraries built for `load_inline` are published in the judge's cache, hidden from candidates: each gets a copy
    of its own. Held out (red team, 2026-12-04): the published folder was readable to every candidate, so one with
    no kernel imported another's library from it (correct, 9x eager); before that, planting files in another's
    folder (read-only since)."""
    from conftest import CANDIDATES

    judges = {mode: Judge("cpu", fast_config(cache_dir, sandbox=mode)) for mode in ("required", "none")}
    honest = judges["required"].evaluate(AFFINE, CANDIDATES / "affine_relu_single.py")  # publishes one library
    assert honest.correct and honest.build["inline"], honest.error
    root = judges["required"].inline.root
    assert [d for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")]
    body = ("r = {}\n        for what, act in [('list', lambda: os.listdir(%r)), "
            "('plant', lambda: open(os.path.join(%r, 'pwned'), 'w').write('x'))]:\n"
            "            try:\n                act(); r[what] = 'done'\n"
            "            except OSError as exc:\n                r[what] = errno.errorcode[exc.errno]\n"
            "        raise RuntimeError('W=' + json.dumps(r))") % ((str(root),) * 2)
    verdict = judges["required"].evaluate(AFFINE, candidate(tmp_path, "pass", body))
    found = json.JSONDecoder().raw_decode(verdict.error.split("W=", 1)[1])[0]  # (then where it was raised)
    assert found == {"list": "ENOENT", "plant": "ENOENT"}, verdict.error  # (the cache is covered)
    assert not (root / "pwned").exists(), "a candidate wrote into the extensions"
    plain = judges["none"].evaluate(AFFINE, candidate(tmp_path, "pass", body))  # the barrier is the sandbox's
    assert '"list": "done"' in plain.error, plain.error
    (root / "pwned").unlink()


def test_the_output_pool_library_stays_readable_to_a_sandboxed_candidate(visible_dir, tmp_path):
    """The GPU candidate's process loads the output pool's allocator from the judge's folder of published libraries.
    Once that folder was hidden (2026-12-04), every GPU candidate died at its first call (the H200, 2026-12-05: "the
    process ended during call 0", every verdict -1): the pool's own folder is bound back, readable, and nothing
    else of the published folder shows."""
    judge = Judge("cpu", fast_config(visible_dir / "pool-cache", sandbox="required"))
    pool = judge.inline.root / "output-pool" / "output_pool-test.so"
    pool.parent.mkdir(parents=True, exist_ok=True)
    pool.write_text("the allocator")
    (judge.inline.root / "published-other").mkdir(exist_ok=True)
    judge.output_pool = str(pool)
    body = ("r = {}\n        for what, act in [('pool', lambda: open(%r).read()), "
            "('published', lambda: os.listdir(%r)), ('write', lambda: open(%r, 'a').write('x'))]:\n"
            "            try:\n                r[what] = act()\n"
            "            except OSError as exc:\n                r[what] = errno.errorcode[exc.errno]\n"
            "        raise RuntimeError('W=' + json.dumps(r))") % (str(pool), str(judge.inline.root), str(pool))
    verdict = judge.evaluate(AFFINE, candidate(tmp_path, "pass", body))
    found = json.JSONDecoder().raw_decode(verdict.error.split("W=", 1)[1])[0]
    assert found["pool"] == "the allocator" and found["write"] == "EROFS", verdict.error
    assert "published-other" not in found["published"], found


@pytest.mark.skipif(Cgroup.layout() is None, reason="no writable cgroup here: host memory is bounded by rlimits only")
def test_host_memory_is_bounded_by_the_cgroup_alone(visible_cache, tmp_path):
    """On the GPU backend the cgroup is the only bound on host memory (an address-space limit breaks CUDA)."""
    judge = Judge("cpu", fast_config(visible_cache, sandbox="required", memory_limit_gb=2))
    judge.limits.address_space = False  # as on the GPU backend
    hog = candidate(tmp_path, "self.hog = torch.ones(4 << 30, dtype=torch.uint8)", "return x * 1")  # touched
    verdict = judge.evaluate(AFFINE, hog)
    assert "cgroup" in verdict.sandbox and "address space" not in verdict.sandbox, verdict.sandbox
    assert verdict.reward == -1 and "killed by the memory limit" in verdict.error, verdict.error


def test_the_compiler_cannot_read_the_judges_files_into_its_errors(judges, make_workspace):
    """An `#include` of a file the candidate may not read would print it in the build log the agent sees."""
    secrets_file = judges["required"].cache_dir / "secret.txt"
    secrets_file.write_text("SECRET_TOKEN_4242 = 1;\n")
    ws = make_workspace()
    kernel = ws / "kernels" / "affine_relu.cpp"
    kernel.write_text(f'#include "{secrets_file}"\n' + kernel.read_text())
    confined = judges["required"].evaluate(AFFINE, ws)
    assert not confined.compiled and "No such file" in confined.error, confined.error
    assert "SECRET_TOKEN_4242" not in json.dumps(confined.to_dict())
    plain = judges["none"].evaluate(AFFINE, ws)  # the same build outside the sandbox leaks it
    assert "SECRET_TOKEN_4242" in plain.error, plain.error


def test_a_compile_sees_its_own_copy_of_the_workspace_and_no_other(judges, make_workspace, visible_dir):
    """Each unit compiles in a folder of its own and the kernel's open events say what it read: a read of the build
    folder's copy, of another unit's, or of the candidate's own folder by its absolute path (held out, red team
    2026-12-05: `.incbin` of the workspace's own file kept a first object when only that file changed) would go
    unseen, so those are hidden from the compiler, and so is a folder the judge was told to conceal (the episodes
    played beside it)."""
    ws = Path(shutil.copytree(make_workspace(), visible_dir / "ws"))
    neighbour = visible_dir / "episodes" / "00"
    neighbour.mkdir(parents=True)
    (neighbour / "kernel.h").write_text("#define NEIGHBOUR 1\n")
    judges["required"].conceal(neighbour.parent)
    kernel = ws / "kernels" / "affine_relu.cpp"
    for path in ("../../model_new.py", "../1/kernels/affine_relu_binding.cpp", ws / "model_new.py",
                 neighbour / "kernel.h"):
        kernel.write_text(f'asm(".section .rodata\\n.incbin \\"{path}\\"\\n.text\\n");\n' + kernel.read_text())
        build = judges["required"].compile(load_candidate(ws))
        assert not build.ok and "file not found" in build.log, (path, build.log)
        kernel.write_text(kernel.read_text().split("\n", 1)[1])
    assert judges["required"].compile(load_candidate(ws)).ok


def test_a_candidate_gets_no_credentials_and_no_concealed_folder(judges, visible_dir, tmp_path, monkeypatch):
    """Held out (red team, 2026-12-05): a candidate's worker inherited the judge's environment, API keys included,
    and raised them into the verdict the agent reads; and read the episodes played beside it."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-NOT-FOR-CANDIDATES")
    neighbour = visible_dir / "runs" / "01"
    neighbour.mkdir(parents=True)
    (neighbour / "model_new.py").write_text("secret kernel\n")
    judge = Judge("cpu", fast_config(judges["required"].cache_dir, sandbox="required"))
    judge.conceal(neighbour.parent)
    probe = candidate(tmp_path, "raise RuntimeError(repr(os.environ.get('OPENAI_API_KEY')) + ' ' + repr("
                                f"os.path.exists({str(neighbour / 'model_new.py')!r})))", "return x")
    verdict = judge.evaluate(AFFINE, probe)
    judge.close()
    assert "RuntimeError: None False" in verdict.error, verdict.error


def test_a_compiler_reads_nothing_from_the_judges_stdin(judges, make_workspace):
    """Held out (red team, 2026-12-05): compilers inherited the judge's stdin: `#include "/dev/stdin"` printed what
    the judge was given into the build log (or waited on it for the compile's whole timeout)."""
    ws = make_workspace()
    kernel = ws / "kernels" / "affine_relu.cpp"
    kernel.write_text('#include "/dev/stdin"\n' + kernel.read_text())
    script = ("import sys; from pathlib import Path; from cuda_agent.judge import Judge; "
              "from cuda_agent.workspace.candidate import load_candidate; from conftest import fast_config; "
              f"judge = Judge('cpu', fast_config(Path({str(judges['required'].cache_dir)!r}), sandbox='required')); "
              f"print(judge.compile(load_candidate({str(ws)!r})).log)")
    proc = subprocess.run([sys.executable, "-c", script], input="JUDGES_STDIN_4242 = 1;\n", capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "JUDGES_STDIN_4242" not in proc.stdout, proc.stdout


def test_a_compiler_that_reads_without_end_is_stopped_by_its_memory_cap(judges, make_workspace, monkeypatch):
    """Held out (red team, 2026-12-05): `#include "/dev/zero"` read until memory ran out, each parallel compile
    allowed 80% of the machine's. Each compiler run has its own cap now (8 GiB; 1 GiB here)."""
    monkeypatch.setattr(build, "COMPILE_MEMORY_BYTES", 1 << 30)
    ws = make_workspace()
    kernel = ws / "kernels" / "affine_relu.cpp"
    kernel.write_text('#include "/dev/zero"\n' + kernel.read_text())
    result = judges["required"].compile(load_candidate(ws))
    assert not result.ok and ("out of memory" in result.log or "Killed" in result.log), result.log


def test_the_sandboxs_init_process_is_out_of_the_candidates_reach(judges, tmp_path):
    """Held out (red team, 2026-12-05): the sandbox's PID 1 (a waiting shell, never stopped nor counted) shared the
    candidate's user namespace: ptrace or a write of `/proc/1/mem` turned it into a helper that ran torch for a
    kernel-less candidate (strict: correct, no finding) and computed the timed calls' outputs before the clock
    started (reward 1 -> 3). The candidate now runs in a user namespace below PID 1's."""
    probe = candidate(tmp_path, "libc = ctypes.CDLL(None, use_errno=True)\n"
                                "        seized = libc.ptrace(0x4206, 1, 0, 0), ctypes.get_errno()\n"
                                "        try:\n            open('/proc/1/mem', 'r+b')\n            mem = 'opened'\n"
                                "        except OSError as exc:\n            mem = exc.errno\n"
                                "        raise RuntimeError(f'seized={seized} mem={mem}')", "return x")
    verdict = judges["required"].evaluate(AFFINE, probe)
    assert f"seized=(-1, {errno.EPERM}) mem={errno.EACCES}" in verdict.error, verdict.error
