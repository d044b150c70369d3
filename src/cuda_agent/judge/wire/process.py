"""Worker processes and the line protocol between the judge and them.

Each worker is a fresh Python process in its own session (so a timeout kills it and everything it started).
It talks JSON lines over a private duplicate of its stdout; the real fd 1 and fd 2 go to a log file, so
whatever the candidate prints cannot forge a message. The judge answers on the worker's stdin. File descriptors
(shared output memory, `transfer.py`) travel apart, over a socket each worker gets at start (`FD_SOCKET`).
"""

from __future__ import annotations

import array
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from ...sandbox import Sandbox, public_environ

SIGNAL_HINTS = {
    signal.SIGSEGV: "segmentation fault",
    signal.SIGBUS: "bus error",
    signal.SIGABRT: "abort",
    signal.SIGFPE: "floating point exception",
    signal.SIGILL: "illegal instruction",
    signal.SIGKILL: "killed (out of memory?)",
    signal.SIGSYS: "a forbidden system call: it tried to start a process once ModelNew was built",
}
PACKAGE_ROOT = Path(__file__).resolve().parents[3]  # the folder that holds cuda_agent/
FD_SOCKET = "CUDA_AGENT_FD_SOCKET"  # the worker's end of its descriptor socket (a number, in its environment)
MAX_FDS = 200  # descriptors per message (the kernel allows 253)
MAX_LINE = 64 << 20  # bytes of one message from a worker (a candidate's process may write anything there)


def send_fds(sock: socket.socket, fds: list[int]) -> None:
    """`fds` over `sock`, in messages of up to MAX_FDS (nothing is sent for none)."""
    for i in range(0, len(fds), MAX_FDS):
        chunk = array.array("i", fds[i:i + MAX_FDS])
        sock.sendmsg([b"f"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, chunk)])


def receive_fds(sock: socket.socket, count: int, timeout: float | None = None) -> list[int]:
    """Exactly `count` descriptors from `sock` (what arrives beyond them in a message is closed). Raises OSError
    (TimeoutError after `timeout` seconds) when they do not come."""
    fds: list[int] = []
    sock.settimeout(timeout)
    try:
        while len(fds) < count:
            data, ancillary, flags, _ = sock.recvmsg(16, socket.CMSG_SPACE(MAX_FDS * 4))
            got = array.array("i")
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    got.frombytes(payload[:len(payload) - len(payload) % got.itemsize])
            fds += got
            if not data and not got:
                raise ConnectionError("the descriptor socket was closed")
            if flags & socket.MSG_CTRUNC:
                raise OSError("descriptors were cut off")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    for fd in fds[count:]:
        os.close(fd)
    return fds[:count]


def close_fds(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class BoundedLog:
    """Drains a worker's output (fd 1 and 2) into a log file, keeping the first `head` bytes there and only the
    last `tail` bytes of the rest in memory, so megabytes of prints can neither fill the disk nor stall the worker."""

    def __init__(self, stream, path: Path, head: int = 1 << 20, tail: int = 64 << 10):
        self.path, self.head, self.tail_size = path, head, tail
        self.written = self.dropped = 0
        self._tail = bytearray()
        self._lock = threading.Lock()
        self._file = open(path, "wb")
        self._thread = threading.Thread(target=self._drain, args=(stream,), daemon=True)
        self._thread.start()

    def _drain(self, stream) -> None:
        for chunk in iter(lambda: stream.read1(65536), b""):
            with self._lock:
                room = max(0, self.head - self.written)
                if room:
                    self._file.write(chunk[:room])
                    self._file.flush()
                    self.written += min(room, len(chunk))
                self.dropped += len(chunk) - min(room, len(chunk))
                self._tail += chunk  # the last bytes of all of it, held here: the file lies in a folder the
                del self._tail[:-self.tail_size]  # candidate writes (a link there was read back: red team)

    def tail(self, limit: int) -> str:
        with self._lock:
            data = bytes(self._tail)
        return data[-limit:].decode(errors="replace")

    def drained(self, timeout: float) -> None:
        """Wait (up to `timeout` seconds) until everything the worker wrote is read: after it died, its last lines."""
        self._thread.join(timeout=timeout)

    def close(self) -> None:
        self.drained(10)
        with self._lock:
            if self.dropped and not self._file.closed:
                last = bytes(self._tail[-min(self.dropped, len(self._tail)):])
                note = b"\n[... %d bytes dropped; the last %d follow ...]\n" % (self.dropped, len(last))
                self._file.write(note)
                self._file.write(last)
            self._file.close()


class WorkerDied(RuntimeError):
    """The worker ended without the expected message; `str()` is the reason for the verdict."""


class WorkerProcess:
    def __init__(self, module: str, request: dict, run_dir: Path, env: dict[str, str] | None = None,
                 sandbox: Sandbox | None = None, trusted: bool = True):
        """`trusted`: the judge's own worker, which inherits this process's environment; an untrusted one (the
        candidate's, a dataset filter's) gets it without credentials (`sandbox.public_environ`)."""
        self.log_path = run_dir / f"{module.rsplit('.', 1)[-1]}.log"
        run_dir.mkdir(parents=True, exist_ok=True)
        request_path = run_dir / f"{module.rsplit('.', 1)[-1]}.request.json"
        request_path.write_text(json.dumps(request))
        full_env = {**(os.environ if trusted else public_environ()), **(env or {})}
        full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), full_env.get("PYTHONPATH")]))
        full_env["PYTHONUNBUFFERED"] = "1"
        self.fd_socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        full_env[FD_SOCKET] = str(theirs.fileno())
        with theirs:
            self.proc = subprocess.Popen(
                [*(sandbox.prefix() if sandbox else []), sys.executable, "-X", "faulthandler", "-m", module,
                 str(request_path)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=run_dir, env=full_env,
                start_new_session=True, pass_fds=[theirs.fileno()])
        self.sandbox = sandbox
        self._log = BoundedLog(self.proc.stderr, self.log_path)
        self._buffer = bytearray()
        self._scanned = 0  # bytes of the buffer known to hold no newline
        self.started = time.monotonic()

    def receive(self, deadline: float) -> dict[str, Any]:
        """Next message, or WorkerDied with the reason (crash, exit, timeout)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while (end := self._buffer.find(b"\n", self._scanned)) < 0:
            self._scanned = len(self._buffer)
            if self._scanned > MAX_LINE:
                self.kill()
                raise WorkerDied(f"protocol error from worker: a message longer than {MAX_LINE >> 20} MiB")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise WorkerDied(f"timed out after {time.monotonic() - self.started:.0f}s (killed)")
            ready, _, _ = select.select([fd], [], [], min(remaining, 1.0))
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                raise WorkerDied(self._death_reason())
            self._buffer += chunk
        line = bytes(self._buffer[:end])
        del self._buffer[:end + 1]
        self._scanned = 0
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            message = None
        if not isinstance(message, dict):
            self.kill()
            raise WorkerDied(f"protocol error from worker: {line[:200]!r}")
        return message

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass

    def send_fds(self, fds: list[int]) -> None:
        try:
            send_fds(self.fd_socket, fds)
        except OSError:  # it died: the next receive says how
            pass

    def receive_fds(self, count: int, deadline: float) -> list[int]:
        """`count` descriptors the worker sent (OSError when they do not come before the deadline)."""
        return receive_fds(self.fd_socket, count, max(0.0, deadline - time.monotonic()))

    def _death_reason(self) -> str:
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()
            return "closed its channel and hung (killed)"
        self.kill()  # reap anything it left in its session
        self._log.drained(5)  # (its last lines say why: read by a thread that may not have reached them yet; with
        # 1 s, 36 of 46 reference workers' deaths beside fifteen other evaluations on an H100 came with no reason)
        if code > 128 and code - 128 in signal.valid_signals():  # a shell in between reports a signal this way
            code = -(code - 128)
        if code < 0:
            sig = signal.Signals(-code)
            return f"crashed with {sig.name} ({SIGNAL_HINTS.get(sig, 'signal')})" + self._tail_hint()
        return f"exited with code {code}" + self._tail_hint()

    def _tail_hint(self) -> str:
        limits = self.sandbox.events() if self.sandbox else []
        if limits:
            return f" ({', '.join(limits)})"
        tail = self.log_tail(4000).strip().splitlines()
        return f": {fault_site(tail) or error_line(tail)[:300]}" if tail else ""

    def log_tail(self, limit: int = 4000) -> str:
        return self._log.tail(limit)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        self.kill()
        if self.sandbox:
            self.sandbox.close()
        self._log.close()
        self.fd_socket.close()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream:
                try:
                    stream.close()
                except OSError:  # a message it never read (it died): nothing to flush it to
                    pass


class Channel:
    """The worker's end: `send` JSON lines to the judge, `receive` its replies."""

    def __init__(self) -> None:
        self._out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)  # prints (the candidate's too) go to the log, which the judge attached to fd 2
        sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
        fd = os.environ.pop(FD_SOCKET, None)
        self.fd_socket = socket.socket(fileno=int(fd)) if fd else None
        if self.fd_socket:
            os.set_inheritable(self.fd_socket.fileno(), False)

    def send(self, event: str, **payload: Any) -> None:
        self._out.write(json.dumps({"event": event, **payload}, default=str) + "\n")
        self._out.flush()

    def receive(self) -> dict[str, Any]:
        line = sys.stdin.readline()
        return json.loads(line) if line else {"command": "exit"}

    def send_fds(self, fds: list[int]) -> None:
        """Descriptors for the judge: send them before the message that counts them."""
        assert self.fd_socket is not None, "started without a descriptor socket"
        send_fds(self.fd_socket, fds)

    def receive_fds(self, count: int) -> list[int]:
        assert self.fd_socket is not None, "started without a descriptor socket"
        return receive_fds(self.fd_socket, count)


class WorkerFailure(Exception):
    """Ends a worker with one event (e.g. `task_error`, `load_error`, `verify_error`) and a one-line message."""

    def __init__(self, event: str, error: str):
        super().__init__(error)
        self.event = event


def one_line(exc: BaseException) -> str:
    """`Type: first meaningful line` of an exception (the line mentioning an error when there is one)."""
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    detail = next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else "")
    return f"{type(exc).__name__}: {detail.strip()[:500]}"


def raised_at(exc: BaseException, frames: int = 3) -> str:
    """Where `exc` was raised: its traceback's last `frames` frames as ` (at FILE:LINE in FUNC <- ...)`, innermost
    first, files by name ("" without a traceback)."""
    found = traceback.extract_tb(exc.__traceback__)[-frames:]
    if not found:
        return ""
    return " (at " + " <- ".join(f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in reversed(found)) + ")"


Handler = Callable[[dict], tuple[str, dict]]


def run_worker(start: Callable[[dict, Channel], dict[str, Handler]], fallback_event: str,
               prepare: Callable[[dict], None] | None = None) -> None:
    """A worker's main: read the request, start, then answer commands until told to stop.

    `start` sets the worker up (sending its own ready message) and returns the command handlers; each handler
    returns the reply event and its payload, to which the seconds it took are added. A spare (request
    `{"spare": true, ...}`, started before its evaluation is known) runs `prepare` first, then waits for its real
    request as the first command.
    """
    request = json.loads(Path(sys.argv[1]).read_text())
    chan = Channel()
    try:
        if request.get("spare"):
            if prepare:
                prepare(request)
            first = chan.receive()
            request = first.get("request")
            if request is None:  # the judge closed without using it (or sent something else: say what)
                print(f"worker ends: a spare's first message was not its request: {str(first)[:300]}",
                      file=sys.stderr, flush=True)
                return
        handlers = start(request, chan)
        while True:
            cmd = chan.receive()
            handler = handlers.get(cmd.get("command", ""))
            if handler is None:  # "exit" (the judge closed its end), or a message that is not a command
                if cmd != {"command": "exit"}:
                    print(f"worker ends: not a command: {str(cmd)[:300]}", file=sys.stderr, flush=True)
                else:
                    print("worker ends: its command pipe was closed", file=sys.stderr, flush=True)
                return
            began = time.perf_counter()
            event, payload = handler(cmd)
            chan.send(event, **payload, seconds=time.perf_counter() - began)
    except WorkerFailure as failure:
        chan.send(failure.event, error=str(failure))
    except Exception as exc:
        traceback.print_exc()
        chan.send(fallback_event, error=f"{Path(sys.argv[0]).stem} failed: {one_line(exc)}{raised_at(exc)}")


EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*")


def error_line(lines: list[str]) -> str:
    """The line of a worker's log that says what went wrong: why it ended when it says, else the last exception's own
    line (a CUDA error's is followed by torch's advice on debugging it), else the last line."""
    if lines[-1].startswith("worker ends:"):
        return lines[-1]
    return next((line for line in reversed(lines) if EXCEPTION_LINE.match(line)), lines[-1])


def fault_site(lines: list[str]) -> str | None:
    """Where a worker crashed, from faulthandler's report in its log (every worker runs with `-X faulthandler`): the
    crashing thread's innermost Python frame (the native code it called is what faulted), or None."""
    current = [i for i, line in enumerate(lines) if line.startswith("Current thread")]
    frames = [line.strip() for line in lines[current[-1] + 1:] if line.strip().startswith("File ")] if current else []
    return f"in native code called at {frames[0][:240]}" if frames else None
