"""The judge: one object that turns (reference task, candidate) into a verdict with the milestone reward.

    judge = Judge("cuda")
    verdict = judge.evaluate("level1/19_ReLU.py", "my_workspace/")

The Judge holds what evaluations share (builders, the store, warm reference workers, spare candidate workers, the
device lock and memory budget); one evaluation, phase by phase, is an `Evaluation` (evaluation.py). Every abnormal
end is a verdict, not an exception; only a broken reference (`TaskError`) or an unusable backend (`BackendError`)
raises. The policy (`strict`, CUDA Agent's rules, or `kernelbench`) decides whether torch compute is allowed; every
other check applies to both.
"""

from __future__ import annotations

import os
import secrets
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable

import torch

from .. import sandbox
from ..backend import Backend, BackendError, get_backend
from ..task import Task, load_task
from ..workspace.build import Builder, BuildResult
from ..workspace.cache_budget import CacheKeeper
from ..workspace.candidate import Candidate, load_candidate
from ..workspace.inline import InlineBuilder
from . import kernelbench
from .candidate import output_pool
from .checks.policy import COMPUTE_PACKAGES, compute_packages
from .config import POLICIES, TIMINGS, JudgeConfig
from .device_lock import DeviceLock
from .evaluation import Evaluation
from .memory_budget import MemoryBudget
from .references import ReferenceFailed, ReferencePool, ReferenceWorker
from .spares import Spares
from .store import Store
from .timekeeper import Timekeeper
from .trusted import cpu_sampler
from .verdict import Verdict
from .wire.process import WorkerProcess

CRASHED = "candidate process crashed with "  # how a verdict's error begins when a signal killed the candidate
ABORTED = "evaluation aborted: "  # ... when the task's reference worker failed during the evaluation


def compile_threads(workers: int) -> int:
    """Inductor's compile workers for each of `workers` evaluations in flight: the cores shared out. Left to
    itself, each worker process starts a pool of one per core (16 evaluations on 16 cores: 256 processes)."""
    return max(1, (os.cpu_count() or 1) // workers)


class Judge:
    def __init__(self, backend: str | Backend = "cuda", config: JudgeConfig | None = None, device: int | None = None,
                 compile_threads: int | None = None):
        """`device`: the GPU index its workers run on (CUDA_VISIBLE_DEVICES); None: the process's default.
        `compile_threads`: inductor's compile workers per worker process (a pool gives each evaluation in flight
        its share of the cores; None: inductor's default, a pool of one per core; TORCHINDUCTOR_COMPILE_THREADS
        set by the user wins)."""
        self.config = config or JudgeConfig()
        self.device, self.compile_threads = device, compile_threads
        self.backend = get_backend(backend) if isinstance(backend, str) else backend
        self.backend.check_toolchain()
        if self.config.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {self.config.policy!r}")
        if self.config.timing not in TIMINGS:
            raise ValueError(f"timing must be one of {', '.join(TIMINGS)}, not {self.config.timing!r}")
        self.cache_dir = Path(self.config.cache_dir).expanduser().resolve()
        (self.cache_dir / "runs").mkdir(parents=True, exist_ok=True)
        try:
            self.sandboxed = sandbox.resolve(self.config.sandbox)
        except (ValueError, RuntimeError) as exc:
            raise BackendError(str(exc)) from exc
        # hidden from every candidate's process and compilers: the cache, and the folders `conceal` adds (one list)
        confined = [self.cache_dir] if self.sandboxed else None
        self.builder = Builder(self.backend, self.cache_dir / "build", confined=confined,
                               budget_s=min(self.config.build_timeout_s, self.config.build_budget_s))
        self.inline = InlineBuilder(self.cache_dir / "extensions", self.backend.identity(), self.worker_env(),
                                    confined, self.config.build_timeout_s, getattr(self.backend, "arch", ""))
        # the GPU's trusted path: outputs allocated where the trusted side reads them (in a folder candidates see)
        self.output_pool = str(output_pool.build(self.inline.root / "output-pool")) \
            if self.backend.trusted_clock and self.backend.device == "cuda" else None
        limit = self.config.memory_limit_gb
        # No CPU-seconds rlimit (the timeouts bound the candidate): it would make the process's CPU clock coarse,
        # and the worker reads that clock to see threads working outside the calls.
        self.limits = sandbox.Limits(memory_bytes=int(limit * 2**30) if limit else None,
                                     max_processes=self.config.max_processes, cpu_seconds=None,
                                     address_space=self.backend.name == "cpu")
        self.store = Store(self.cache_dir / "judge.sqlite")
        self.timekeeper = Timekeeper(self.config, self.store)
        self.references = ReferencePool(self.config.warm_references, self.cache_dir / "runs",
                                        self.config.warm_memory_gb * 2**30)
        self.device_lock = DeviceLock()  # timing: one evaluation at a time on the device
        self.memory = MemoryBudget(self.config.warm_memory_gb * 2**30)  # what evaluations in flight may hold
        self.spares = Spares(self.config.spare_candidates, self.cache_dir / "runs", self._start_candidate)
        self.cache_keeper = CacheKeeper(self.cache_dir, self.config.cache_budget_gb)
        self.on_phase: Callable[[str, float], None] | None = None  # (phase, seconds) as each phase ends

    def close(self) -> None:
        """Stop the warm reference workers and the spare candidate workers."""
        self.references.close()
        self.spares.close()

    def __enter__(self) -> "Judge":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- public --------------------------------------------------------------------------------------
    def evaluate(self, reference: str | Path | Task, candidate: str | Path | Candidate, alone: bool = False,
                 deadline: float | None = None) -> Verdict:
        """Judge `candidate` against `reference`. With `alone`, nothing else runs on the device from the moment the
        reference is this evaluation's to the verdict (other evaluations on this judge wait; idle warm reference
        workers are stopped first). A candidate whose process is killed by a signal is judged once more in a fresh
        process (torch's profiler, which the op audit runs in that process, has crashed now and then on exit with
        correct kernels: measured in docs/judge.md), and so is one whose evaluation the reference worker's failure
        aborted (with a fresh reference worker: 5 of 229 verdicts on the H200 once); the verdict says so in
        `warnings`, and a second failure of either kind stands. `deadline` (time.monotonic; an episode's time
        limit): the candidate is waited for no longer, no phase starts after it, and a verdict it cut short is a
        failure whose error begins with `OUT_OF_TIME` (never judged twice)."""
        task = reference if isinstance(reference, Task) else load_task(reference)
        cand = candidate if isinstance(candidate, Candidate) else load_candidate(candidate)
        deadline = float("inf") if deadline is None else deadline
        first = self._evaluate_once(task, cand, alone, deadline)
        self.cache_keeper.tick()
        if not (first.error or "").startswith((CRASHED, ABORTED)) or time.monotonic() >= deadline:
            return first
        verdict = self._evaluate_once(task, cand, alone, deadline)
        why = first.error.splitlines()[0].removeprefix("candidate ")
        verdict.warnings.append(f"judged twice: the first {why[:300]}")
        verdict.seconds = round(verdict.seconds + first.seconds, 3)
        return verdict

    def _evaluate_once(self, task: Task, cand: Candidate, alone: bool, deadline: float) -> Verdict:
        start = time.perf_counter()
        cfg = self.config
        seeds = list(cfg.seeds) if cfg.seeds else kernelbench.trial_seeds(trials=cfg.num_trials) \
            if cfg.policy == "kernelbench" else [secrets.randbelow(2**31) for _ in range(cfg.num_trials)]
        verdict = Verdict(
            reward=-1, compiled=False, correct=False, backend=self.backend.name, torch_version=torch.__version__,
            tolerance={"atol": cfg.atol, "rtol": cfg.rtol}, seeds=seeds,
            sandbox="namespaces (candidate not started)" if self.sandboxed else sandbox.NONE_DESCRIPTION,
            task={"name": task.name, "path": str(task.path), "hash": task.hash}, policy=cfg.policy,
            candidate={"kind": cand.kind, "path": str(cand.origin), "hash": cand.hash})
        verdict.error = cand.missing_model_new()
        if verdict.error:  # said before building, so the verdict does not read as a failed build
            verdict.device = self.backend.device_name(self.device)
            verdict.seconds = round(time.perf_counter() - start, 3)
            return verdict
        slot = self.spares.take()  # its candidate worker has started already (or starts now)
        if self.backend.name != "cpu":  # the next evaluation's worker starts up while this one runs (on the cpu
            self.spares.top_up()        # backend the cores are the device: not beside a timed run)
        try:
            Evaluation(self, task, cand, seeds, verdict, slot, alone, deadline).run()
        finally:
            slot.close(keep=cfg.keep_run_dirs)
            self.spares.top_up()  # more evaluations are likely: their workers start while this one is reported
        verdict.seconds = round(time.perf_counter() - start, 3)
        return verdict

    def compile(self, candidate: Candidate, deadline: float | None = None) -> BuildResult:
        """Build a candidate as an evaluation would (same sandbox, same cached objects), without running it; no
        longer than to `deadline` (time.monotonic)."""
        with tempfile.TemporaryDirectory(dir=self.cache_dir / "runs") as tmp:
            return self.builder.build(candidate, Path(tmp), float("inf") if deadline is None else deadline)

    def conceal(self, path: Path) -> None:
        """Hide `path` from every candidate judged from now on (its process, its compilers, its `load_inline`
        builds): the run folders of episodes played side by side, whose kernels are not another's to read or copy
        (each candidate's own folder is hidden from its compilers anyway). Spares started before are replaced."""
        path = Path(path).resolve()
        if self.builder.confined is None or any(path.is_relative_to(p) for p in self.builder.confined):
            return
        self.builder.confined.append(path)  # (the inline builder's list too)
        self.spares.discard()

    @property
    def private_paths(self) -> list[Path]:
        """What a candidate's own commands (the agent's shell) must not see: the judge's cache (baselines, builds)."""
        return [self.cache_dir]

    # ---- what its evaluations use -----------------------------------------------------------------------
    def baseline_key(self, task: Task, verdict: Verdict) -> str:
        """Baselines are cached per (task, backend, device, torch version, timing settings, clock; sampled or not:
        on the cpu backend's trusted path under strict, every call is, which slows it a little)."""
        clock = "trusted-clock" if self.backend.trusted_clock else "in-process-clock"
        if self.backend.name == "cpu" and self.backend.trusted_clock and self.config.policy == "strict" and \
                cpu_sampler.unavailable() is None:
            clock += f"|sampled-{self.sample_period_ns()}ns"
        return "|".join([task.hash, self.backend.name, str(verdict.device), verdict.torch_version,
                         self.config.timing_key(), clock])

    def sample_period_ns(self) -> int:
        """The trusted CPU sampler's period (`cpu_sample_period_us`); ValueError under a microsecond (an event of
        period 0 counts and samples nothing: every candidate would go undecided)."""
        period_us = self.config.cpu_sample_period_us
        if period_us is not None and not period_us >= 1:
            raise ValueError(f"cpu_sample_period_us must be at least 1, not {period_us}")
        return cpu_sampler.PERIOD_NS if period_us is None else round(period_us * 1000)

    def compile_baseline(self, ref: ReferenceWorker, until: float = float("inf")) -> float:
        """torch.compile's first run, once the candidate is verified (one that fails never waits for it) and before
        the device is this evaluation's: its kernels and inductor's benchmarks use the device, so they hold it
        shared (never beside a timed run); while dynamo and inductor compile (CPU seconds, up to minutes for a large
        model) the reference worker hands it back and timed runs go on. Returns the seconds it was handed back (0
        where compiling would disturb timing: on the cpu backend). `until` (time.monotonic): the caller's deadline,
        where the reference worker is killed (ReferenceFailed; the baseline compiles again next time)."""
        gate = self.backend.compiles_beside_timing
        held = ExitStack()
        held.enter_context(self.device_lock.shared())
        try:
            ref.send({"command": "prepare", "gate": gate})
            deadline = time.monotonic() + self.config.reference_timeout_s
            while True:
                msg = ref.next_message(min(deadline, until))
                if msg["event"] == "prepared":
                    return float(msg.get("unlocked_s", 0.0))
                if gate and msg["event"] == "device_free":
                    held.close()
                elif gate and msg["event"] == "device_wanted":
                    began = time.monotonic()
                    held.enter_context(self.device_lock.shared())
                    deadline += time.monotonic() - began  # waiting for timed runs is not the reference's time
                    ref.send({"device": True})
                else:
                    raise ReferenceFailed(f"reference {ref.task.path}: {msg.get('error', msg)}")
        finally:
            held.close()

    def timing(self) -> dict[str, Any]:
        c = self.config
        return {"warmup": c.warmup, "min_iters": c.min_iters, "max_iters": c.max_iters,
                "target_time_s": c.target_time_s}

    def _start_candidate(self, run_dir: Path) -> WorkerProcess:
        """A candidate worker for a run folder, started before its candidate is known (`spares.py`)."""
        return WorkerProcess("cuda_agent.judge.candidate.candidate_worker",
                             {"spare": True, "backend": self.backend.name},
                             run_dir / "candidate", self._candidate_env(run_dir),
                             self._candidate_sandbox(run_dir), trusted=False)

    def _candidate_sandbox(self, run_dir: Path) -> sandbox.Sandbox | None:
        """The candidate sees its build, the public inputs, the task file and the output pool's library; writes only
        its own folders (where its `load_inline` libraries are copied: the published ones, every candidate's, stay
        hidden, and the output pool's folder among them is bound back)."""
        if not self.sandboxed:
            return None
        compute = compute_packages() if self._blocks_compute_packages() else []  # numpy & co. cannot be imported
        pool = [Path(self.output_pool).parent] if self.output_pool else []
        # (its own folder, on the judge's disk, only read: a candidate writes to its private /tmp and /dev/shm, whose
        # memory its cgroup bounds; held out, red team 2026-12-06: fallocate() in a writable folder of the judge's
        # disk took all of it in milliseconds, for every evaluation and store beside it)
        view = sandbox.View(readable=[run_dir / "candidate", run_dir / "build", run_dir / "public", run_dir / "task",
                                      *pool],
                            hidden=[*self.builder.confined, *map(Path, compute)])
        return sandbox.Sandbox(view, self.limits, cwd=run_dir / "candidate")

    def _blocks_compute_packages(self) -> bool:
        """Strict policy on the trusted path. (The cuda backend's in-process path needs numpy in the candidate's
        process: torch reads CUDA array interfaces with it.)"""
        return self.config.policy == "strict" and self.backend.trusted_clock

    def _candidate_env(self, run_dir: Path) -> dict[str, str]:
        """Nothing the candidate writes is shared: its own torch extension and inductor folders."""
        private = Path("/tmp") if self.sandboxed else run_dir / "candidate"
        blocked = ",".join(COMPUTE_PACKAGES) if self._blocks_compute_packages() else ""
        return {**self.worker_env(), "CUDA_AGENT_BLOCKED_PACKAGES": blocked,
                "TORCHINDUCTOR_CACHE_DIR": str(private / "inductor"),
                "TORCH_EXTENSIONS_DIR": str(private / "torch_extensions"),
                **({"HOME": "/tmp", "TMPDIR": "/tmp"} if self.sandboxed else {})}

    def worker_env(self) -> dict[str, str]:
        # Idle OpenMP threads sleep at once instead of spinning (both workers alike): after a call returns, a
        # thread that still burns CPU is then doing the candidate's work (candidate_worker.Guard).
        env = {"TORCHINDUCTOR_CACHE_DIR": str(self.cache_dir / "inductor"), "MAX_JOBS": str(os.cpu_count() or 1),
               "OMP_WAIT_POLICY": "PASSIVE"}
        if self.device is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(self.device)
        if self.compile_threads and "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ:
            env["TORCHINDUCTOR_COMPILE_THREADS"] = str(self.compile_threads)
        return {**env, **self.backend.worker_env()}
