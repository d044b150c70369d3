"""The judge pool on Ray: the same API as `JudgePool`, served by Ray actors, so a cluster's judge GPUs serve
rollouts from every node (optional extra `ray`; the local `JudgePool` stays the default).

One actor per GPU (`num_gpus=1`: Ray gives each actor a GPU of its own, and its workers see only that GPU); each
actor is a `Judge` taking `workers` evaluations at once on threads, with timing one at a time
on its GPU, as in `JudgePool`. Tasks and candidates travel by content, so an actor on another node needs no shared
filesystem; the verdict comes back with the caller's paths.

    pool = RayJudgePool("cuda", JudgeConfig(), actors=8)        # ray.init() first, or address="auto"
    verdict = pool.submit("level1/19_ReLU.py", "my_workspace/").result()

It stands in for a `JudgePool` wherever the agent takes one (`agent.Environment`, verl's agent loop with
`judge="ray"`): `backend.name`, `config`, `sandboxed`, `compile` (on an actor) and `private_paths` as there.
"""

from __future__ import annotations

import hashlib
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..task import Task, load_task
from ..workspace.build import BuildResult
from ..workspace.candidate import Candidate, load_candidate
from .config import JudgeConfig
from .verdict import Verdict


@dataclass(frozen=True)
class RemoteBackend:
    """What callers of a pool read of its backend when the backend itself lives in the actors."""
    name: str


class JudgeActor:
    """A Judge inside a Ray actor: it writes each task it is sent to a local file once, and judges."""

    def __init__(self, backend: str, config: JudgeConfig, workers: int):
        from .judge import Judge, compile_threads

        self.judge = Judge(backend, config, compile_threads=compile_threads(workers))
        self.tasks = Path(tempfile.mkdtemp(prefix="ray-judge-tasks-"))

    def evaluate(self, task: Task, candidate: Candidate, time_left_s: float | None = None) -> dict[str, Any]:
        """`time_left_s`: the caller's deadline as seconds from the call (clocks differ between nodes)."""
        deadline = None if time_left_s is None else time.monotonic() + time_left_s
        local = task.path
        if not (local.is_file() and local.read_text() == task.source):  # another node, or the file changed since
            local = self.tasks / hashlib.sha256(task.source.encode()).hexdigest()[:16] / task.path.name
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_text(task.source)
        verdict = self.judge.evaluate(Task(local, task.source), candidate, deadline=deadline)
        verdict.task["path"] = str(task.path)
        return verdict.to_dict()

    def compile(self, candidate: Candidate, time_left_s: float | None = None) -> BuildResult:
        return self.judge.compile(candidate, None if time_left_s is None else time.monotonic() + time_left_s)

    def conceal(self, path: Path) -> None:
        self.judge.conceal(path)

    def describe(self) -> dict[str, Any]:
        return {"backend": self.judge.backend.name, "sandboxed": self.judge.sandboxed}

    def close(self) -> None:
        self.judge.close()


class RayJudgePool:
    def __init__(self, backend: str = "cuda", config: JudgeConfig | None = None, actors: int | None = None,
                 workers: int = 4, address: str | None = None):
        """`actors`: judge actors (default: one per GPU in the cluster, one for the cpu backend); `workers`:
        evaluations in flight per actor (its builds overlap; its GPU phases take turns)."""
        try:
            import ray
        except ImportError as exc:
            raise ImportError("the Ray judge pool needs Ray: pip install 'cuda-agent[ray]'") from exc
        if not ray.is_initialized():
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        self.config = config or JudgeConfig()
        gpus = backend == "cuda"
        if actors is None:
            actors = int(ray.cluster_resources().get("GPU", 0)) if gpus else 1
        if actors < 1 or workers < 1:
            raise ValueError(f"a Ray judge pool needs at least one actor and one worker (actors={actors}"
                             + (", no GPU in the Ray cluster)" if gpus else ")"))
        remote = ray.remote(num_gpus=1 if gpus else 0, num_cpus=0 if gpus else 1,
                            max_concurrency=workers)(JudgeActor)
        self.actors = [remote.remote(backend, self.config, workers) for _ in range(actors)]
        described = ray.get([a.describe.remote() for a in self.actors])  # an actor that cannot start fails here
        self.backend = RemoteBackend(described[0]["backend"])
        self.sandboxed = all(d["sandboxed"] for d in described)
        self._in_flight = [0] * actors
        self._lock = threading.Lock()
        self._ray = ray

    def _least_busy(self) -> int:
        with self._lock:
            index = min(range(len(self.actors)), key=self._in_flight.__getitem__)
            self._in_flight[index] += 1
        return index

    def submit(self, reference: str | Path | Task, candidate: str | Path | Candidate,
               deadline: float | None = None) -> Future[Verdict]:
        """Judge on the actor with the fewest evaluations in flight; the future's result is the verdict.
        `deadline`: `Judge.evaluate`'s (this process's clock)."""
        task = reference if isinstance(reference, Task) else load_task(reference)
        cand = candidate if isinstance(candidate, Candidate) else load_candidate(candidate)
        index = self._least_busy()
        result: Future[Verdict] = Future()

        def done(raw: Future) -> None:
            with self._lock:
                self._in_flight[index] -= 1
            try:
                result.set_result(Verdict.from_dict(raw.result()))
            except Exception as exc:  # a TaskError raised in the actor arrives wrapped by Ray: unwrap it
                cause = getattr(exc, "cause", None)
                result.set_exception(cause if isinstance(cause, Exception) else exc)

        self.actors[index].evaluate.remote(task, cand, _left(deadline)).future().add_done_callback(done)
        return result

    def evaluate(self, reference: str | Path | Task, candidate: str | Path | Candidate,
                 deadline: float | None = None) -> Verdict:
        return self.submit(reference, candidate, deadline).result()

    def compile(self, candidate: Candidate, deadline: float | None = None) -> BuildResult:
        """Build as an evaluation would, on an actor (the agent's `compile` tool)."""
        index = self._least_busy()
        try:
            return self._ray.get(self.actors[index].compile.remote(candidate, _left(deadline)))
        finally:
            with self._lock:
                self._in_flight[index] -= 1

    def conceal(self, path: Path) -> None:
        """Hide `path` from the candidates of every actor (`Judge.conceal`: a path of the node they share)."""
        self._ray.get([actor.conceal.remote(path) for actor in self.actors])

    @property
    def private_paths(self) -> list[Path]:
        """The judge cache's path, hidden from the agent's shell where an actor shares this node."""
        return [Path(self.config.cache_dir).expanduser().resolve()]

    def close(self) -> None:
        """Stop the actors (their warm reference workers with them)."""
        for actor in self.actors:
            try:
                self._ray.get(actor.close.remote())
            finally:
                self._ray.kill(actor)
        self.actors = []

    def __enter__(self) -> "RayJudgePool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _left(deadline: float | None) -> float | None:
    """A deadline of this process's clock as seconds from now, for an actor on another node."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())
