"""Many evaluations at once on one machine: `JudgePool`, the judge behind eval-suite, the agent's suites and RL.

One `Judge` per device (GPU index, or the CPU), all sharing the cache (objects, precompiled headers, published
libraries, baselines). Evaluations run on threads: builds, candidate loads and everything else on the CPU overlap
on all cores, while timing holds its device's lock (verification holds it shared), so no two timed runs share a
device. Each evaluation goes to the device with the fewest in flight. Verdicts are those a lone `Judge` gives: an
evaluation that ran out of device memory while others shared the device is judged again with the device to itself
(the evaluations in flight on it finish first, and none starts there until it is done).

    with JudgePool("cuda", JudgeConfig(), devices=[0, 1]) as pool:
        futures = [pool.submit(task, candidate) for task, candidate in work]
        verdicts = [f.result() for f in futures]
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ..backend import Backend
from ..task import Task, TaskError
from ..workspace.build import BuildResult
from ..workspace.candidate import Candidate
from .config import JudgeConfig
from .device_lock import DeviceLock
from .judge import ABORTED, Judge, compile_threads
from .verdict import Verdict

# how running out of device memory reads: torch's allocator and the driver; cuBLAS and cuDNN creating a handle
OUT_OF_MEMORY = ("out of memory", "cublas_status_alloc_failed", "cudnn_status_alloc_failed")


def out_of_memory(error: str) -> bool:
    return any(sign in error.lower() for sign in OUT_OF_MEMORY)


def default_workers(backend: str, devices: int) -> int:
    """Enough evaluations in flight to keep every core building and every GPU busy: up to 16 per GPU (most of an
    evaluation is CPU work or waits for the device), no more than the cores. On the cpu backend the cores are the
    device: builds beside a timed run would slow it, so one at a time unless asked."""
    return 1 if backend == "cpu" else max(2 * devices, min(16 * devices, os.cpu_count() or 1))


class JudgePool:
    def __init__(self, backend: str | Backend = "cuda", config: JudgeConfig | None = None,
                 devices: list[int] | None = None, workers: int | None = None):
        """`devices`: GPU indices to use (None: the default device only; the cpu backend has one device)."""
        indices: list[int | None] = list(devices) if devices else [None]
        name = backend if isinstance(backend, str) else backend.name
        self.workers = workers or default_workers(name, len(indices))
        if self.workers < 1:
            raise ValueError("a judge pool needs at least 1 worker")
        self.judges = [Judge(backend, config, device=d, compile_threads=compile_threads(self.workers))
                       for d in indices]
        self.config, self.backend = self.judges[0].config, self.judges[0].backend
        self.sandboxed, self.cache_dir = self.judges[0].sandboxed, self.judges[0].cache_dir
        for judge in self.judges:  # enough candidate workers started ahead for the evaluations in flight on it
            judge.spares.count = max(judge.spares.count, -(-self.workers // len(self.judges)))
        self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="judge")
        # per device: evaluations hold it shared, one judged again alone exclusively (the memory of the others gone)
        self._turns = [DeviceLock() for _ in self.judges]
        self._in_flight = [0] * len(self.judges)
        self._lock = threading.Lock()

    def submit(self, reference: str | Path | Task, candidate: str | Path | Candidate,
               deadline: float | None = None) -> Future[Verdict]:
        """Judge in the background; the future's result is the verdict (or the TaskError/BackendError it raised).
        `deadline`: `Judge.evaluate`'s."""
        with self._lock:
            index = min(range(len(self.judges)), key=self._in_flight.__getitem__)
            self._in_flight[index] += 1
        future = self._executor.submit(self._evaluate, index, reference, candidate, deadline)
        future.add_done_callback(lambda _: self._done(index))
        return future

    def evaluate(self, reference: str | Path | Task, candidate: str | Path | Candidate,
                 deadline: float | None = None) -> Verdict:
        return self.submit(reference, candidate, deadline).result()

    def _evaluate(self, index: int, reference: str | Path | Task, candidate: str | Path | Candidate,
                  deadline: float | None) -> Verdict:
        judge, turns = self.judges[index], self._turns[index]

        def again(error: str) -> bool:  # short of memory beside the others, or its reference worker failed there
            # (twice: Judge.evaluate tried once more, and the second failure's words need not say why: 3 episodes of
            # the ninth recipe attempt on an H100 ended on such a verdict), with time left to judge it alone
            return self.workers > 1 and (out_of_memory(error) or error.startswith(ABORTED)) and (
                deadline is None or time.monotonic() < deadline)

        try:
            with turns.shared():
                verdict = judge.evaluate(reference, candidate, deadline=deadline)
            error = verdict.error or ""
            if not again(error):
                return verdict
        except TaskError as exc:  # the reference itself could not run
            error = str(exc)
            if not again(error):
                raise
        with turns.exclusive():
            verdict = judge.evaluate(reference, candidate, alone=True, deadline=deadline)
        why = "ran out of device memory" if out_of_memory(error) else "its reference worker failed"
        verdict.warnings.append(f"{why} beside other evaluations: judged again alone")
        return verdict

    def compile(self, candidate: Candidate, deadline: float | None = None) -> BuildResult:
        return self.judges[0].compile(candidate, deadline)

    def conceal(self, path: Path) -> None:
        for judge in self.judges:
            judge.conceal(path)

    @property
    def private_paths(self) -> list[Path]:
        return self.judges[0].private_paths

    def _done(self, index: int) -> None:
        with self._lock:
            self._in_flight[index] -= 1

    def close(self, abandon: bool = False) -> None:
        """Wait for the evaluations in flight, then stop the judges. With `abandon`: drop the evaluations not
        started and stop the judges first, so those in flight end at once (their verdicts are failures)."""
        if abandon:
            for judge in self.judges:
                judge.close()
        self._executor.shutdown(wait=True, cancel_futures=abandon)
        for judge in self.judges:
            judge.close()

    def __enter__(self) -> "JudgePool":
        return self

    def __exit__(self, kind, *exc) -> None:
        self.close(abandon=kind is not None)  # an exception or Ctrl-C: nothing more is judged


_shared: dict[tuple, JudgePool] = {}
_shared_lock = threading.Lock()


def shared_pool(backend: str, devices: list[int] | None = None, judge: str = "local") -> JudgePool:
    """One pool per process and setting, for callers that cannot hold one themselves (verl's agent loops and
    reward functions are built per episode); closed at exit. `judge`: "local" (this machine's GPUs `devices`) or
    "ray" (`RayJudgePool`: one judge actor per free GPU of the Ray cluster this process belongs to)."""
    if judge not in ("local", "ray"):
        raise ValueError(f"judge must be 'local' or 'ray', not {judge!r}")
    key = (backend, tuple(devices or ()), judge)
    with _shared_lock:
        if key not in _shared:
            if judge == "ray":
                from .ray_pool import RayJudgePool

                pool = RayJudgePool(backend, JudgeConfig())
            else:
                pool = JudgePool(backend, JudgeConfig(), devices=list(devices) if devices else None)
            atexit.register(pool.close)
            _shared[key] = pool
        return _shared[key]
