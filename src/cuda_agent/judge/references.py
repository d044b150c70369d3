"""Warm reference workers: one per task (and worker settings), kept alive across evaluations, least recently used
first out, within a count and a memory budget.

Starting a reference worker (import torch, build `Model`, probe it, and for the baselines compile it) costs seconds
per evaluation; RL and suites judge the same task again and again. An evaluation reserves the task's worker when it
starts (a cold one loads while the candidate builds), leases it exclusively once the candidate is ready, and each
lease begins with fresh weights from its own seed, so nothing but the process is reused. A worker that failed is
dropped, and the next evaluation starts a new one. Candidate workers are never reused.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from ..task import Task, TaskError
from .wire.process import WorkerDied, WorkerProcess
from .wire.trusted_commands import REPLIES, decode, encode


class ReferenceFailed(RuntimeError):
    """The reference worker failed after it had run the task once: the evaluation ends with a failure verdict."""


class ReferenceWorker:
    """One reference worker process for one task."""

    def __init__(self, task: Task, request: dict[str, Any], env: dict[str, str], root: Path):
        self.task = task
        self.folder = Path(tempfile.mkdtemp(prefix=f"ref-{task.name[:40]}-", dir=root))
        try:
            self.process = WorkerProcess("cuda_agent.judge.trusted.reference_worker",
                                         {**request, "task_path": str(task.path),
                                          "init_seed": secrets.randbelow(2**31)}, self.folder, env)
        except BaseException:  # (Ctrl-C or SIGTERM while it starts: no one else knows the folder yet)
            shutil.rmtree(self.folder, ignore_errors=True)
            raise
        self.lock = threading.Lock()  # one evaluation at a time
        self.users = 0  # evaluations that reserved it
        self.failed = False
        self.begun = 0  # evaluations it began
        self.memory = 0  # bytes of device memory (host RAM on cpu) it held after its last evaluation
        self.peak = self.device_total = 0  # the most it ever held; the device's memory
        self._ready: dict[str, Any] | None = None
        self._ready_lock = threading.Lock()

    def wait_ready(self, timeout_s: float) -> dict[str, Any]:
        """The worker's `ready` message (device, torch version, precision). A failure here is the reference's
        own: TaskError, the user's error."""
        with self._ready_lock:
            if self._ready is None:
                try:
                    self._ready = self.receive("ready", timeout_s, TaskError)
                except TaskError:
                    self.failed = True
                    raise
            return self._ready

    def call(self, command: dict[str, Any], expected: str, timeout_s: float,
             error: type[Exception] = ReferenceFailed) -> dict[str, Any]:
        self.process.send(command)
        return self.receive(expected, timeout_s, error)

    def ask(self, command: Any, timeout_s: float) -> Any:
        """A typed command (wire/trusted_commands.py) and its typed reply."""
        reply = REPLIES[command.COMMAND]
        return decode(reply, self.call(encode(command), reply.EVENT, timeout_s))

    def send(self, command: dict[str, Any]) -> None:
        self.process.send(command)

    def send_fds(self, fds: list[int]) -> None:
        self.process.send_fds(fds)

    def receive(self, expected: str, timeout_s: float, error: type[Exception] = ReferenceFailed) -> dict[str, Any]:
        msg = self.next_message(time.monotonic() + timeout_s, error)
        if msg["event"] != expected:
            raise error(f"reference {self.task.path}: {msg.get('error', msg)}")
        return msg

    def next_message(self, deadline: float, error: type[Exception] = ReferenceFailed) -> dict[str, Any]:
        try:
            return self.process.receive(deadline)
        except WorkerDied as exc:
            raise error(f"reference {self.task.path}: the reference worker {exc}") from exc

    @contextmanager
    def lease(self) -> Iterator["ReferenceWorker"]:
        """Exclusive use for one evaluation; a failure seen during it retires the worker."""
        with self.lock:
            try:
                yield self
                reply = self.call({"command": "memory"}, "memory", 60)
                self.memory, self.peak, self.device_total = reply["bytes"], reply["peak"], reply["total"]
            except (ReferenceFailed, TaskError):
                self.failed = True
                raise

    def close(self) -> None:
        self.process.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class ReferencePool:
    """Warm workers by (task hash, worker settings): the most recently used idle ones are kept, at most `size`
    (0: one worker per evaluation) holding at most `memory_bytes` together."""

    def __init__(self, size: int, root: Path, memory_bytes: float = float("inf")):
        self.size, self.root, self.memory_bytes = size, Path(root), memory_bytes
        self.workers: OrderedDict[str, ReferenceWorker] = OrderedDict()
        self.lock = threading.Lock()
        self.closed = False

    @contextmanager
    def reserve(self, task: Task, request: dict[str, Any], env: dict[str, str]) -> Iterator[ReferenceWorker]:
        """The task's worker for one evaluation: started now if there is none (it loads meanwhile)."""
        key = f"{task.hash}|{sorted(request.items())}|{sorted(env.items())}"
        with self.lock:
            if self.closed:
                raise RuntimeError("the judge was closed")
            worker = self.workers.get(key)
            if worker is None or worker.failed:
                worker = self.workers[key] = ReferenceWorker(task, request, env, self.root)
            self.workers.move_to_end(key)
            worker.users += 1
        try:
            yield worker
        finally:
            with self.lock:
                worker.users -= 1
                retired = [worker] if worker.failed or (self.size <= 0 and not worker.users) else []
                if retired and self.workers.get(key) is worker:
                    del self.workers[key]
                kept, held = 0, 0
                for k, w in reversed([(k, w) for k, w in self.workers.items() if not w.users]):  # newest first
                    kept, held = kept + 1, held + w.memory
                    if kept > self.size or held > self.memory_bytes:
                        del self.workers[k]
                        retired.append(w)
            for w in dict.fromkeys(retired):
                if not w.users:
                    w.close()

    def drop_idle(self) -> None:
        """Stop the warm workers no evaluation holds (they keep device memory)."""
        with self.lock:
            idle = [(k, w) for k, w in self.workers.items() if not w.users]
            for k, _ in idle:
                del self.workers[k]
        for _, worker in idle:
            worker.close()

    def close(self) -> None:
        with self.lock:
            self.closed = True
            workers, self.workers = list(self.workers.values()), OrderedDict()
        for worker in workers:
            worker.close()
