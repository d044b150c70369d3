"""First program inside the sandbox's namespaces (as their root): builds the filesystem view, then execs.

Standalone (standard library only) and run by path, `python -I init.py SPEC_JSON COMMAND...`, so nothing from
the environment is imported with namespace-root rights. The view:
- every mount read-only (recursively), except: a fresh `/tmp`, a fresh `/dev` holding only the usual character
  devices and the GPU's, a fresh `/dev/shm`, `/proc`, and the `writable` paths;
- `hidden` directories covered by an empty read-only tmpfs (the judge's cache, home directories), hidden files
  replaced by an empty one (`/etc/shadow`);
- `writable` and `readable` paths bound back at their own path, even inside a hidden or replaced directory.
The command then runs inside a further user + mount namespace (see `sandbox.command`), which locks these mounts:
its root cannot unmount or remount them.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

MS_NOSUID, MS_NODEV, MS_BIND, MS_REC = 2, 4, 4096, 16384
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY, SYS_MOUNT_SETATTR = -100, 0x8000, 0x1, 442
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"}
EXIT_SETUP_FAILED = 125

libc = ctypes.CDLL(None, use_errno=True)


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def set_readonly(path: str, readonly: bool, recursive: bool) -> None:
    attr = MountAttr(MOUNT_ATTR_RDONLY if readonly else 0, 0 if readonly else MOUNT_ATTR_RDONLY, 0, 0)
    rc = libc.syscall(ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_int(AT_FDCWD), path.encode(),
                      ctypes.c_uint(AT_RECURSIVE if recursive else 0), ctypes.byref(attr),
                      ctypes.c_size_t(ctypes.sizeof(attr)))
    _check(rc, f"mount_setattr {path}")


def bind(fd: int, target: str, readonly: bool) -> None:
    """Bind what `fd` (O_PATH, opened before the view changed) points at onto `target`, creating the target."""
    source = f"/proc/self/fd/{fd}"
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    elif not os.path.exists(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
    mount(source, target, None, MS_BIND)
    set_readonly(target, readonly, recursive=False)


def populate_dev(dev_fd: int) -> None:
    mount("tmpfs", "/dev", "tmpfs", MS_NOSUID, "mode=755,size=64k")
    names = [n for n in os.listdir(f"/proc/self/fd/{dev_fd}") if n in DEVICES or n.startswith("nvidia")]
    for name in names:
        fd = os.open(f"/proc/self/fd/{dev_fd}/{name}", os.O_PATH)
        bind(fd, f"/dev/{name}", readonly=False)
        os.close(fd)
    for name, target in LINKS.items():
        os.symlink(target, f"/dev/{name}")
    os.mkdir("/dev/shm")
    mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")


def inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def depth(path: str) -> int:
    return len(path.rstrip("/").split("/"))


def showing(path: str, covers: list[str], targets: list[str]) -> bool:
    """Whether `path` shows in the view: its nearest enclosing mount is the host's root or a bound-back folder,
    not a cover or the fresh /tmp."""
    enclosing = [(depth(m), kind) for kind, mounts in ((0, ["/tmp", *covers]), (1, targets)) for m in mounts
                 if m != path and inside(path, m)]
    return not enclosing or max(enclosing)[1] == 1


def build_view(spec: dict) -> None:
    binds = [(p, False) for p in spec["writable"]] + [(p, True) for p in spec["readable"]]
    fds = [os.open(path, os.O_PATH) for path, _ in binds]  # before anything is covered
    dev_fd = os.open("/dev", os.O_PATH | os.O_DIRECTORY)
    every = [os.path.realpath(h) for h in spec["hidden"] if os.path.isdir(h)]  # (the host's /tmp still shows)
    set_readonly("/", True, recursive=True)
    set_readonly("/proc", False, recursive=False)  # the locking user namespace writes its uid map there
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    populate_dev(dev_fd)
    targets = [os.path.realpath(path) for path, _ in binds]
    # A tmpfs over each hidden folder that would show otherwise: one whose nearest enclosing mount is the host's
    # read-only root or a bound-back folder (the judge's cache inside a visible tree, in /tmp too), not one already
    # inside a cover or the fresh /tmp, where it is gone and would not be a mount point (an episode's workspace
    # inside its hidden episodes folder, both in a script's folder bound back: every view failed).
    covers: list[str] = []
    for h in sorted(dict.fromkeys(every), key=depth):
        if showing(h, covers, targets):
            covers.append(h)
    # Every mount in the order of its depth, so that none covers a deeper one made before it (a script's folder
    # on sys.path, bound back read-only, holding the judge's cache and the build's writable folders in it).
    steps = [(h, 0, None) for h in covers] + [(t, 1, i) for i, t in enumerate(targets)]
    for path, _, i in sorted(steps, key=lambda step: (depth(step[0]), step[1])):
        if i is None:
            mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755")
        else:
            bind(fds[i], binds[i][0], binds[i][1])
            os.close(fds[i])
    for path in spec["hidden"]:  # a hidden file reads as empty
        if os.path.isfile(path) and showing(os.path.realpath(path), covers, targets):
            mount("/dev/null", path, None, MS_BIND)
    for path in covers:
        set_readonly(path, True, recursive=False)


def main() -> None:
    spec, command = json.loads(sys.argv[1]), sys.argv[2:]
    try:
        build_view(spec)
    except OSError as exc:
        print(f"cuda-agent sandbox: could not build the filesystem view: {exc}", file=sys.stderr, flush=True)
        sys.exit(EXIT_SETUP_FAILED)
    os.chdir(spec["cwd"])
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
