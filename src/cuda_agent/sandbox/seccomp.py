"""A seccomp filter that ends the process the moment it tries to start another one.

Under the strict policy a first filter, installed before the candidate's code is imported, answers new processes
with EPERM (red team 2026-12-06: a compiler run from `__init__` built torch's own AOTInductor library). Installed by
the candidate's worker once `ModelNew` is built: from then on `fork`, `vfork` and `clone` without
`CLONE_THREAD` (what `fork()`, `subprocess` and `posix_spawn` use) kill the whole process with SIGSYS, so work
handed to a child process can neither escape the op audit, the trusted side's freezer nor the judge's timeout.
Threads stay allowed (`clone3` answers ENOSYS, so the C library falls back to `clone`, which is inspected). Any
other system-call ABI (x86's 32-bit `int 0x80`, x32's numbers, arm32) kills the process too: its numbers differ,
so nothing here would hold for it (held out: `int 0x80` fork passed an earlier filter that let other ABIs be).
Leaving the sandbox's view (`unshare`, `setns`, mounts: a process moved out of the cgroup the judge watches) and
io_uring (kernel threads working on the process's behalf) answer EPERM. The filter covers every thread (TSYNC)
and cannot be removed. x86-64 and aarch64.

A second filter (`forbid_moved_mappings`, the cpu backend's candidates) refuses `mremap` that may move a mapping:
the trusted CPU sampler learns of every executable mapping a call makes from the kernel's records, which a move does
not make (held out, forty-first session: torch's text swapped for the candidate's own library's file at each reply
by moving mappings into place). The C library's `realloc` falls back to copying.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

# (audit arch, seccomp syscall, {name: number}, numbers refused with EPERM) per machine
_SHARED = (425, 426, 427, 428, 429, 430, 431, 432, 433, 442)  # io_uring_*, open_tree .. fspick, mount_setattr
_ARCH = {
    "x86_64": (0xC000003E, 317, {"clone": 56, "fork": 57, "vfork": 58, "clone3": 435},
               (272, 308, 165, 166, 155, 161) + _SHARED),  # unshare, setns, mount, umount2, pivot_root, chroot
    "aarch64": (0xC00000B7, 277, {"clone": 220, "clone3": 435}, (97, 268, 40, 39, 41, 51) + _SHARED),
}
_X32_BIT = 0x40000000  # x32's system calls: x86-64's arch, this bit set in the number
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_KILL_PROCESS, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_CLONE_THREAD = 0x00010000
_MREMAP = {"x86_64": 25, "aarch64": 216}
_MREMAP_MAYMOVE = 1
_PR_SET_NO_NEW_PRIVS, _SET_MODE_FILTER, _FLAG_TSYNC = 38, 1, 1


class SeccompError(OSError):
    """The filter could not be installed here."""


def _program(arch: int, calls: dict[str, int], refused: tuple[int, ...], kill: bool = True) -> bytes:
    """Classic BPF over `struct seccomp_data` (nr at 0, arch at 4, args[0] low word at 16). `kill`: a new process
    kills this one; otherwise its system call answers EPERM."""
    new_process = _RET_KILL_PROCESS if kill else _RET_ERRNO | errno.EPERM
    insns: list[tuple[int, int, int, int]] = []

    def op(code: int, k: int, jt: int = 0, jf: int = 0) -> None:
        insns.append((code, jt, jf, k))

    op(_LD_W_ABS, 4)
    op(_JEQ_K, arch, 1, 0)
    op(_RET_K, _RET_KILL_PROCESS)  # another ABI
    op(_LD_W_ABS, 0)
    if arch == _ARCH["x86_64"][0]:
        op(_JGE_K, _X32_BIT, 0, 1)
        op(_RET_K, _RET_KILL_PROCESS)
    op(_JEQ_K, calls["clone3"], 0, 1)
    op(_RET_K, _RET_ERRNO | errno.ENOSYS)
    for name in ("fork", "vfork"):
        if name in calls:
            op(_JEQ_K, calls[name], 0, 1)
            op(_RET_K, new_process)
    for nr in refused:
        op(_JEQ_K, nr, 0, 1)
        op(_RET_K, _RET_ERRNO | errno.EPERM)
    op(_JEQ_K, calls["clone"], 1, 0)
    op(_RET_K, _RET_ALLOW)
    op(_LD_W_ABS, 16)
    op(_JSET_K, _CLONE_THREAD, 0, 1)
    op(_RET_K, _RET_ALLOW)
    op(_RET_K, new_process)
    return b"".join(struct.pack("HBBI", *insn) for insn in insns)


def _moves_program(arch: int, nr_mremap: int) -> bytes:
    """`mremap` with MREMAP_MAYMOVE (flags: args[3], low word at 40) answers EPERM, as does every x32 call (its
    numbers differ); every other call is allowed (another ABI's pointers are 32-bit: no address of torch's)."""
    insns: list[tuple[int, int, int, int]] = []

    def op(code: int, k: int, jt: int = 0, jf: int = 0) -> None:
        insns.append((code, jt, jf, k))

    op(_LD_W_ABS, 4)
    op(_JEQ_K, arch, 1, 0)
    op(_RET_K, _RET_ALLOW)
    op(_LD_W_ABS, 0)
    if arch == _ARCH["x86_64"][0]:
        op(_JGE_K, _X32_BIT, 0, 1)
        op(_RET_K, _RET_ERRNO | errno.EPERM)
    op(_JEQ_K, nr_mremap, 1, 0)
    op(_RET_K, _RET_ALLOW)
    op(_LD_W_ABS, 40)
    op(_JSET_K, _MREMAP_MAYMOVE, 0, 1)
    op(_RET_K, _RET_ERRNO | errno.EPERM)
    op(_RET_K, _RET_ALLOW)
    return b"".join(struct.pack("HBBI", *insn) for insn in insns)


def forbid_new_processes(kill: bool = True) -> None:
    """Install the filter on every thread of this process; raises SeccompError where the kernel refuses. `kill`
    false: a new process is refused (EPERM) rather than fatal (filters stack: a later killing one still kills)."""
    machine = platform.machine()
    if machine not in _ARCH:
        raise SeccompError(errno.ENOSYS, f"no seccomp filter for {machine}")
    arch, nr_seccomp, calls, refused = _ARCH[machine]
    _install(nr_seccomp, _program(arch, calls, refused, kill))


def forbid_moved_mappings() -> None:
    """Install the second filter (mremap that may move: EPERM) on every thread; SeccompError where it cannot be."""
    machine = platform.machine()
    if machine not in _ARCH:
        raise SeccompError(errno.ENOSYS, f"no seccomp filter for {machine}")
    _install(_ARCH[machine][1], _moves_program(_ARCH[machine][0], _MREMAP[machine]))


def _install(nr_seccomp: int, code: bytes) -> None:
    prog_buf = ctypes.create_string_buffer(code, len(code))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = SockFprog(len(code) // 8, ctypes.addressof(prog_buf))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise SeccompError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    rc = libc.syscall(ctypes.c_long(nr_seccomp), ctypes.c_uint(_SET_MODE_FILTER), ctypes.c_uint(_FLAG_TSYNC),
                      ctypes.byref(prog))
    if rc != 0:
        raise SeccompError(ctypes.get_errno(), f"seccomp(SET_MODE_FILTER) failed (rc {rc})")
