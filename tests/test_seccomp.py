"""The candidate worker's seccomp filters (sandbox/seccomp.py), probed in a child Python: each way of starting a
process or leaving the sandbox's view is tried once without the filter (it gets through) and once with it; and the
cpu backend's second filter, against mappings moved."""

import platform
import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="the probes are x86-64 machine code")

PROBES = {
    # i386's fork (eax 2) through `int 0x80`: the 32-bit ABI, which an earlier filter let through unchecked
    "int80_fork": """
        import ctypes, mmap, os
        page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        page.write(bytes([0xB8, 2, 0, 0, 0, 0xCD, 0x80, 0xC3]))  # mov eax, 2; int 0x80; ret
        fork32 = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
        if fork32() == 0:
            os._exit(0)
        print("forked")
        """,
    # x32's getpid (x86-64's arch, bit 30 set in the number)
    "x32_call": """
        import ctypes
        ctypes.CDLL(None).syscall(ctypes.c_long(0x40000000 | 39))
        print("called")
        """,
    # a new mount namespace (then a cgroup mounted there, a process moved out of the group the judge reads)
    "unshare": """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        print("unshared" if libc.unshare(0x00020000 | 0x10000000) == 0 else f"refused {ctypes.get_errno()}")
        """,
    "thread": """
        import threading
        t = threading.Thread(target=lambda: None)
        t.start(); t.join()
        print("threaded")
        """,
}


def probe(name: str, filtered: bool) -> subprocess.CompletedProcess:
    setup = ("from cuda_agent.sandbox.seccomp import forbid_new_processes\nforbid_new_processes()\n"
             if filtered else "")
    body = "\n".join(line[8:] for line in PROBES[name].splitlines())
    # unshare needs a user namespace of its own to succeed unfiltered (as the sandbox's root has one)
    cmd = ["unshare", "-Ur", sys.executable, "-c", setup + body] if name == "unshare" else \
        [sys.executable, "-c", setup + body]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("name, unfiltered, filtered", [
    ("int80_fork", "forked", -signal.SIGSYS),
    ("x32_call", None, -signal.SIGSYS),
    ("unshare", "unshared", "refused 1"),
    ("thread", "threaded", "threaded"),
])
def test_the_filter_kills_other_abis_and_refuses_namespaces_but_lets_threads_be(name, unfiltered, filtered):
    plain = probe(name, filtered=False)
    if name == "int80_fork" and plain.returncode == -signal.SIGSEGV:
        pytest.skip("this kernel has no 32-bit system calls (no IA32 emulation)")
    if name == "unshare" and plain.returncode != 0 and "unshare" in plain.stderr:
        pytest.skip(f"no user namespaces here: {plain.stderr.strip()[:200]}")
    if unfiltered is not None:  # the probe works without the filter, so the filter is what stops it
        assert plain.stdout.strip() == unfiltered, (plain.returncode, plain.stderr[-500:])
    got = probe(name, filtered=True)
    if isinstance(filtered, int):
        assert got.returncode == filtered and not got.stdout, (got.returncode, got.stdout, got.stderr[-500:])
    else:
        assert got.returncode == 0 and got.stdout.strip() == filtered, (got.returncode, got.stderr[-500:])


def test_a_candidate_worker_s_mappings_cannot_be_moved_but_realloc_still_works():
    """The filter the cpu backend's candidate worker installs before the candidate's code: mremap that may move a
    mapping answers EPERM (moves leave no record for the sampler); resizing in place and the C library's realloc
    (which falls back to copying) still work."""
    probe = """import ctypes
from cuda_agent.sandbox.seccomp import forbid_moved_mappings
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = libc.mremap.restype = libc.malloc.restype = libc.realloc.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
libc.realloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
forbid_moved_mappings()
a, b = (libc.mmap(None, 1 << 20, 3, 0x22, -1, 0) for _ in range(2))
moved = libc.mremap(a, 1 << 20, 1 << 20, 3, b)  # MREMAP_MAYMOVE | MREMAP_FIXED
print(moved == b, ctypes.get_errno(), libc.mremap(a, 1 << 20, 1 << 19, 0, None) == a,
      bool(libc.realloc(libc.malloc(1 << 22), 1 << 24)))
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["False", "1", "True", "True"], (done.stdout, done.stderr)
