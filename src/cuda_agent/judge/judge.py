"""The judge: one object that turns (reference task, candidate) into a verdict with the milestone reward.

    judge = Judge("cuda")
    verdict = judge.evaluate("level1/19_ReLU.py", "my_workspace/")

One evaluation: scan the candidate's sources; build it (from copies, with cached objects, compilers sandboxed)
while a reference worker draws fresh inputs and computes reference outputs; run the candidate in its own
sandboxed process under the op audit, comparing its outputs in the reference worker; time it beside eager and
torch.compile (timekeeper.py); score it (scoring.py). Every abnormal end is a verdict, not an exception; only a
broken reference (`TaskError`) or an unusable backend (`BackendError`) raises. The policy (`strict`, CUDA Agent's
rules, or `kernelbench`) decides whether torch compute is allowed; every other check applies to both.
"""

from __future__ import annotations

import math
import os
import secrets
import socket
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from ..backend import Backend, BackendError, get_backend
from .. import sandbox
from ..task import Task, TaskError, describe_sizes, extra_shape, load_task, shape_constants
from ..workspace.build import Builder, BuildResult
from ..workspace.candidate import Candidate, load_candidate
from ..workspace.inline import InlineBuilder, InlineError
from .config import POLICIES, JudgeConfig
from .device_lock import DeviceLock
from .freezer import split_worker
from .memory_budget import MemoryBudget
from .policy import COMPUTE_PACKAGES, compute_packages, scan_sources
from .process import WorkerDied, WorkerProcess, close_fds
from .reference_worker import SCALE_MAX
from .references import ReferenceFailed, ReferencePool, ReferenceWorker
from .scoring import PRECISION_WARN_RATIO, score
from .spares import Slot, Spares
from .store import Store
from .symbols import library_problems
from .timekeeper import Timekeeper, TimingFailed, TimingOutcome
from .verdict import Verdict

READ_LIMIT = 16 << 30  # bytes the trusted side reads of one output at most


def compile_threads(workers: int) -> int:
    """Inductor's compile workers for each of `workers` evaluations in flight: the cores shared out. Left to
    itself, each worker process starts a pool of one per core (16 evaluations on 16 cores: 256 processes)."""
    return max(1, (os.cpu_count() or 1) // workers)


class Phases:
    """Wall time of each evaluation phase, recorded in the verdict (where an evaluation spends its time)."""

    def __init__(self, verdict: Verdict, notify: Callable[[str, float], None] | None = None):
        self.verdict, self.notify = verdict, notify
        self.last = time.perf_counter()

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.verdict.phases_s[name] = round(now - self.last, 3)
        self.last = now
        if self.notify:
            self.notify(name, self.verdict.phases_s[name])


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
        self.cache_dir = Path(self.config.cache_dir).expanduser().resolve()
        (self.cache_dir / "runs").mkdir(parents=True, exist_ok=True)
        try:
            self.sandboxed = sandbox.resolve(self.config.sandbox)
        except (ValueError, RuntimeError) as exc:
            raise BackendError(str(exc)) from exc
        confined = [self.cache_dir] if self.sandboxed else None
        self.builder = Builder(self.backend, self.cache_dir / "build", confined=confined)
        self.inline = InlineBuilder(self.cache_dir / "extensions", self.backend.identity(), self._worker_env(),
                                    confined, self.config.build_timeout_s, getattr(self.backend, "arch", ""))
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
        self.memory = MemoryBudget()  # its memory: what the evaluations in flight are expected to hold
        self.spares = Spares(self.config.spare_candidates, self.cache_dir / "runs", self._start_candidate)
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
    def evaluate(self, reference: str | Path | Task, candidate: str | Path | Candidate, alone: bool = False) -> Verdict:
        """Judge `candidate` against `reference`. With `alone`, nothing else runs on the device from the moment the
        reference is this evaluation's to the verdict (other evaluations on this judge wait; idle warm reference
        workers are stopped first)."""
        start = time.perf_counter()
        task = reference if isinstance(reference, Task) else load_task(reference)
        cand = candidate if isinstance(candidate, Candidate) else load_candidate(candidate)
        cfg = self.config
        seeds = list(cfg.seeds) if cfg.seeds else [secrets.randbelow(2**31) for _ in range(cfg.num_trials)]
        verdict = Verdict(
            reward=-1, compiled=False, correct=False, backend=self.backend.name, torch_version=torch.__version__,
            tolerance={"atol": cfg.atol, "rtol": cfg.rtol}, seeds=seeds,
            sandbox="namespaces (candidate not started)" if self.sandboxed else sandbox.NONE_DESCRIPTION,
            task={"name": task.name, "path": str(task.path), "hash": task.hash}, policy=cfg.policy,
            candidate={"kind": cand.kind, "path": str(cand.origin), "hash": cand.hash})
        verdict.error = cand.missing_model_new()
        if verdict.error:  # said before building, so the verdict does not read as a failed build
            verdict.seconds = round(time.perf_counter() - start, 3)
            return verdict
        slot = self.spares.take()  # its candidate worker has started already (or starts now)
        if self.backend.name != "cpu":  # the next evaluation's worker starts up while this one runs (on the cpu
            self.spares.top_up()        # backend the cores are the device: not beside a timed run)
        try:
            self._evaluate(task, cand, seeds, slot, verdict, alone)
        finally:
            slot.close(keep=cfg.keep_run_dirs)
            self.spares.top_up()  # more evaluations are likely: their workers start while this one is reported
        verdict.seconds = round(time.perf_counter() - start, 3)
        return verdict

    def compile(self, candidate: Candidate) -> BuildResult:
        """Build a candidate as an evaluation would (same sandbox, same cached objects), without running it."""
        with tempfile.TemporaryDirectory(dir=self.cache_dir / "runs") as tmp:
            return self.builder.build(candidate, Path(tmp))

    @property
    def private_paths(self) -> list[Path]:
        """What a candidate's own commands (the agent's shell) must not see: the judge's cache (baselines, builds)."""
        return [self.cache_dir]

    # ---- steps ---------------------------------------------------------------------------------------
    def _evaluate(self, task: Task, cand: Candidate, seeds: list[int], slot: Slot, verdict: Verdict,
                  alone: bool) -> None:
        cfg = self.config
        request = {"backend": self.backend.name, "allow_tf32": cfg.allow_tf32, "atol": cfg.atol, "rtol": cfg.rtol,
                   "max_relative_error": cfg.max_relative_error, "compile_mode": cfg.compile_mode,
                   "timing": self._timing(), "trusted_clock": self.backend.trusted_clock,
                   "scaled_inputs": cfg.scaled_inputs}
        key = "|".join([task.hash, self.backend.name, torch.__version__])
        known = self.store.get("memory", key) or {}
        if known:
            self.memory.learn(known["total"])
        waiting = time.perf_counter()
        need = known.get("peak", 0) + known.get("candidate", known.get("peak", 0))  # candidates seen, or as much
        with self.memory.hold(need):
            if known:
                verdict.phases_s["memory_queued"] = round(time.perf_counter() - waiting, 3)
            with self.references.reserve(task, request, self._worker_env()) as ref:  # a cold one starts meanwhile
                self._run(task, cand, seeds, slot, verdict, ref, alone, guess=not need and not alone)
        said = min((verdict.timing.get("baselines") or {}).get("candidate_memory_peak", 0), ref.device_total)
        learnt = {"peak": max(ref.peak, known.get("peak", 0)), "total": ref.device_total or known.get("total", 0),
                  **({"candidate": max(said, known.get("candidate", 0))} if said or "candidate" in known else {})}
        if ref.peak and learnt != known:
            self.store.put("memory", key, learnt)
            self.memory.learn(learnt["total"])

    @contextmanager
    def _alone(self, alone: bool) -> Iterator[None]:
        if not alone:
            yield
            return
        with self.device_lock.exclusive():
            self.references.drop_idle()  # their device memory too
            yield

    @contextmanager
    def _guessed(self, need: int, phases: Phases) -> Iterator[None]:
        """A task never judged here: its reference's guess held in the memory budget (the wait: memory_queued)."""
        with self.memory.hold(need):
            if need:
                phases.mark("memory_queued")
            yield

    def _run(self, task: Task, cand: Candidate, seeds: list[int], slot: Slot, verdict: Verdict,
             ref: ReferenceWorker, alone: bool, guess: bool = False) -> None:
        """`guess`: this cache knows no memory need for the task: its reference's guess is held (`_guessed`) from
        its first device phase to the verdict."""
        cfg = self.config
        run_dir, public = slot.run_dir, slot.run_dir / "public"
        worker: WorkerProcess | None = None
        phases = Phases(verdict, self.on_phase)
        strict = cfg.policy == "strict"
        try:
            verdict.policy_violations = scan_sources(cand.text(), cfg.rules) if strict else []
            build = self._build(cand, run_dir / "build", verdict)  # meanwhile the reference worker builds Model
            phases.mark("build")
            verdict.compiled = build.ok
            verdict.build = {"seconds": round(build.seconds, 3), "log": build.log[-20000:],
                             "steps": [{"source": s.source, "cached": s.cached, "seconds": round(s.seconds, 3)}
                                       for s in build.steps]}
            if build.ok and not verdict.policy_violations:  # loads while the reference worker is still busy
                task_file = run_dir / "task" / task.path.name  # the candidate's view holds this folder
                task_file.write_text(task.source)
                worker = slot.worker
                worker.send({"request": {
                    "build_dir": str(build.build_dir), "kind": cand.kind, "backend": self.backend.name,
                    "task_path": str(task_file), "allow_tf32": cfg.allow_tf32,
                    "allowed_ops": list(cfg.rules.allowed_ops), "audit_ops": strict, "timing": self._timing(),
                    "sandboxed": self.sandboxed, "trusted_inputs": self.backend.trusted_clock}})
                if worker.sandbox:
                    verdict.sandbox = worker.sandbox.describe()
            ready = ref.wait_ready(cfg.reference_timeout_s)
            phases.mark("reference_ready")
            verdict.device, verdict.torch_version, verdict.precision = \
                ready["device"], ready["torch_version"], ready["precision"]
            if not build.ok:
                verdict.error = build.error
                return
            if verdict.policy_violations or worker is None:
                verdict.error = f"policy violation: {verdict.policy_violations[0]}"
                return
            loaded = self._candidate_step(worker, "loaded", verdict, cand)
            phases.mark("candidate_load")
            if loaded is None:
                return
            if ready.get("memory_total"):
                self.memory.learn(ready["memory_total"])
            # from here on its guessed memory, the reference and then the device are this evaluation's (always in
            # this order: no evaluation waits for one while it holds one after it)
            with self._guessed(ready.get("memory_guess", 0) if guess else 0, phases), ref.lease(), \
                    self._alone(alone):
                phases.mark("reference_queued")
                with self.device_lock.shared():  # its first one runs Model on the device
                    phases.mark("begin_queued")
                    begun = ref.call({"command": "begin", "init_seed": secrets.randbelow(2**31),
                                      "public_dir": str(public)}, "begun", cfg.reference_timeout_s, TaskError)
                    phases.mark("reference_begin")
                worker.send({"command": "init", "public_dir": str(public)})
                initialised = self._candidate_step(worker, "initialised", verdict, cand)
                phases.mark("candidate_init")
                if initialised is None:
                    return
                verdict.compiled = True
                verdict.warnings += initialised.get("warnings", [])
                outcome = self._verify_and_time(task, ref, worker, seeds, self._baseline_key(task, verdict), verdict,
                                                phases)
                if outcome is None:
                    return
            peaks = cfg.device_peaks or self.backend.peak_rates(str(verdict.device))
            score(cfg, self.backend.timing_method, outcome, begun["work"], peaks, verdict)
        except WorkerDied as exc:
            verdict.correct = False
            verdict.error = f"candidate process {exc}"
        except ReferenceFailed as exc:  # the reference ran before, so the candidate may be the cause (e.g. OOM)
            verdict.correct = False
            verdict.error = f"evaluation aborted: {exc}"

    def _verify_and_time(self, task: Task, ref: ReferenceWorker, worker: WorkerProcess, seeds: list[int],
                         baseline_key: str, verdict: Verdict, phases: Phases) -> TimingOutcome | None:
        """Verification beside other evaluations' shared device work (their compiles' runs, their verifications),
        never beside a timed run; then timing, with the device to itself. None when the candidate failed (the
        verdict says why)."""
        cfg = self.config
        trusted = self.backend.trusted_clock
        scales = self._attach(ref, worker) if trusted else False
        if scales is None:
            verdict.error = "the candidate left processes running after ModelNew was built: all work must happen " \
                            "in forward"
            return None
        try:
            with self.device_lock.shared():
                phases.mark("verify_queued")
                deadline = time.monotonic() + cfg.run_timeout_s
                verified = self._verify_trusted(task, ref, worker, seeds, scales, deadline, verdict) if trusted \
                    else self._verify(task, ref, worker, seeds, deadline, verdict)
                if not verified:
                    return None
                phases.mark("verify")
            if self.store.get("baselines", baseline_key) is None:  # torch.compile's baseline, for correct ones only
                began = time.monotonic()
                unlocked = self._compile_baseline(ref)
                phases.mark("baseline_compile")
                deadline += time.monotonic() - began
                if unlocked:
                    verdict.phases_s["baseline_compile_unlocked"] = round(unlocked, 3)
            waiting = time.monotonic()
            with self.device_lock.exclusive():
                phases.mark("device_queued")
                deadline += time.monotonic() - waiting  # the candidate's time does not run while it waits
                time_candidate = self._trusted_timing(ref, worker, deadline, verdict) if trusted else \
                    self._worker_timing(ref, worker, deadline, verdict)
                try:
                    outcome = self.timekeeper.run(
                        baseline_key, lambda command, event: ref.call(command, event, cfg.reference_timeout_s),
                        time_candidate)
                    if trusted:
                        self._detach(ref, worker)
                except TimingFailed as exc:
                    verdict.correct = False
                    verdict.policy_violations += exc.violations
                    verdict.error = verdict.error or str(exc)
                    return None
                phases.mark("timing")
            return outcome
        finally:
            if trusted:  # a candidate that failed stays stopped until it is killed (a no-op after `_detach`)
                ref.call({"command": "detach"}, "detached", cfg.reference_timeout_s)

    def _compile_baseline(self, ref: ReferenceWorker) -> float:
        """torch.compile's first run, once the candidate is verified (one that fails never waits for it) and before
        the device is this evaluation's: its kernels and inductor's benchmarks use the device, so they hold it
        shared (never beside a timed run); while dynamo and inductor compile (CPU seconds, up to minutes for a large
        model) the reference worker hands it back and timed runs go on. Returns the seconds it was handed back (0
        where compiling would disturb timing: on the cpu backend)."""
        cfg = self.config
        gate = self.backend.compiles_beside_timing
        held = ExitStack()
        held.enter_context(self.device_lock.shared())
        try:
            ref.send({"command": "prepare", "gate": gate})
            deadline = time.monotonic() + cfg.reference_timeout_s
            while True:
                msg = ref.next_message(deadline)
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

    def _candidate_step(self, worker: WorkerProcess, expected: str, verdict: Verdict,
                        cand: Candidate) -> dict[str, Any] | None:
        """The candidate's next message (its load_inline builds served on the way); None when it failed or broke the
        policy there (the verdict says which)."""
        msg = self._serve_builds(worker, self.config.run_timeout_s, verdict, cand)
        verdict.policy_violations = list(dict.fromkeys(verdict.policy_violations + msg.get("violations", [])))
        if verdict.policy_violations:
            verdict.error = f"policy violation: {verdict.policy_violations[0]}"
        elif msg["event"] != expected:
            verdict.compiled = msg["event"] != "load_error"
            verdict.error = msg.get("error", f"unexpected message {str(msg)[:200]}")
        else:
            return msg
        return None

    def _build(self, cand: Candidate, build_dir: Path, verdict: Verdict) -> BuildResult:
        """A workspace is built here, and its library's symbols checked (strict); a single file's `load_inline`
        calls are built when its worker asks (`_serve_builds`)."""
        if cand.kind == "single_file":
            build_dir.mkdir(parents=True, exist_ok=True)
            cand.write_to(build_dir)
            return BuildResult(True, build_dir, 0.0)
        build = self.builder.build(cand, build_dir)
        if build.ok and self.config.policy == "strict":
            verdict.policy_violations += [f"native code: {p}" for p in library_problems(build.module_path)]
        return build

    def _serve_builds(self, worker: WorkerProcess, budget_s: float, verdict: Verdict,
                      cand: Candidate) -> dict[str, Any]:
        """The worker's next message within `budget_s` plus the time its builds take, building the `load_inline`
        calls it asks for on the way (workspace/inline.py). The evaluation's builds share one budget: at most
        `max_builds` calls and `build_budget_s` seconds with the workspace's build, each call's build stopped when
        the budget is spent."""
        deadline = time.monotonic() + budget_s
        while True:
            msg = worker.receive(deadline)
            if msg.get("event") != "build":
                return msg
            inline = verdict.build.setdefault("inline", [])
            spent = verdict.build.get("seconds", 0.0) + sum(b.get("seconds", 0.0) for b in inline)
            left = self.config.build_budget_s - spent
            if len(inline) >= self.config.max_builds or left <= 0:
                error = (f"load_inline: the evaluation's build budget is spent ({len(inline)} builds, {spent:.0f} s; "
                         f"at most {self.config.max_builds} builds and {self.config.build_budget_s:.0f} s)")
                inline.append({"error": error, "seconds": 0.0})
                worker.send({"error": error})
                continue
            began = time.monotonic()
            try:
                origin = cand.origin.name if cand.kind == "single_file" else "model_new.py"
                built = self.inline.build(msg.get("request"), (origin, cand.text().get("model_new.py", "")),
                                          timeout=min(self.config.build_timeout_s, left))
            except (InlineError, RuntimeError) as exc:
                inline.append({"error": str(exc), "seconds": round(time.monotonic() - began, 3)})
                worker.send({"error": str(exc)})
                continue
            finally:
                deadline += time.monotonic() - began  # within the build budget
            verdict.build.setdefault("inline", []).append(
                {"module": built.module, "cached": built.cached, "seconds": round(built.seconds, 3),
                 "log": built.log[-5000:]})
            problems = library_problems(built.path) if self.config.policy == "strict" else []
            if problems:  # it is not loaded at all
                verdict.policy_violations += [f"native code: {p}" for p in problems]
                worker.send({"error": f"policy violation: {problems[0]}"})
                continue
            worker.send({"path": str(built.path), "module": built.module, "sha256": built.sha256})

    def _verify(self, task: Task, ref: ReferenceWorker, worker: WorkerProcess, seeds: list[int], deadline: float,
                verdict: Verdict) -> bool:
        """Every input set in lockstep: reference outputs, candidate outputs, comparison on the reference side."""
        errors: dict[str, list[float]] = {"candidate": [], "eager": []}
        verdict.max_abs_error = verdict.max_rel_error = 0.0
        for k, seed in enumerate(seeds):
            if not self._trial(task, ref, worker, {"command": "trial", "k": k, "seed": seed}, f"input set {k}",
                               deadline, verdict, errors):
                return False
        shapes = self._extra_shape(task, ref, verdict)
        if shapes:
            label = f"extra shape ({describe_sizes(shapes, task.source)})"
            command = {"command": "trial", "k": len(seeds), "seed": secrets.randbelow(2**31), "shapes": shapes}
            if not self._trial(task, ref, worker, command, label, deadline, verdict, errors):
                return False
        if self.config.scaled_inputs:  # 2-4x the task's inputs: moments of its input distribution no longer hold
            scale = 2 + 2 * secrets.randbelow(10**6) / 10**6
            command = {"command": "trial", "k": len(seeds) + 1, "seed": secrets.randbelow(2**31), "scale": scale}
            if not self._trial(task, ref, worker, command, f"scaled inputs (x{scale:.3f})", deadline, verdict,
                               errors):
                return False
        return self._precision(errors, verdict)

    def _extra_shape(self, task: Task, ref: ReferenceWorker, verdict: Verdict) -> dict[str, int]:
        """The sizes of the extra-shape check: about half of each size of the inputs that can change, those at which
        the task itself runs; where none can, the verdict says so."""
        if not self.config.extra_shapes:
            return {}
        shapes = extra_shape(shape_constants(task.source))
        if not shapes:
            verdict.warnings.append("extra shape not checked: get_inputs() has no size that can change (module-level "
                                    "integers it alone uses, or literal sizes of the tensors it builds)")
            return {}
        fitted = ref.call({"command": "fit_sizes", "shapes": shapes}, "sizes", self.config.reference_timeout_s)
        if not fitted["shapes"]:
            verdict.warnings.append(f"extra shape not checked: the task does not run at other sizes of its inputs "
                                    f"({describe_sizes(shapes, task.source)}: {fitted['reason']})")
        return fitted["shapes"]

    def _precision(self, errors: dict[str, list[float]], verdict: Verdict) -> bool:
        """Every check passed: correct, unless its error against fp64 is too far beyond fp32 eager's own."""
        verdict.correct = True
        if errors["candidate"] and errors["eager"]:
            c, e = max(errors["candidate"]), max(errors["eager"])
            ratio = (c + 1e-12) / (e + 1e-12)
            verdict.error_vs_fp64 = {"candidate": c, "eager_fp32": e, "ratio": ratio}
            limit = self.config.max_error_ratio
            finding = f"error vs fp64 is {ratio:.0f}x fp32 eager's ({c:.2e} vs {e:.2e})"
            likely = "the candidate likely computes in lower precision (TF32/fp16/bf16)"
            if limit is not None and ratio > limit and c > 1e-6:
                verdict.correct = False
                verdict.error = f"precision: {finding}, above the limit of {limit:g}x: {likely}"
                return False
            if ratio > PRECISION_WARN_RATIO and c > 1e-6:
                verdict.warnings.append(f"precision: {finding}; {likely}")
        return True

    def _trial(self, task: Task, ref: ReferenceWorker, worker: WorkerProcess, command: dict[str, Any], label: str,
               deadline: float, verdict: Verdict, errors: dict[str, list[float]]) -> bool:
        """One input set: the reference draws it and computes its outputs, the candidate runs on it, the reference
        compares. False on failure (the verdict says why)."""
        ref.send({"command": "trial", "seed": command["seed"], "shapes": command.get("shapes"),
                  "scale": command.get("scale")})
        worker.send(command)
        ready = ref.receive("trial_ready", self.config.reference_timeout_s)
        msg = worker.receive(deadline)
        if ready["checksums"] is None:  # the task itself does not hold at these sizes: nothing to check
            verdict.warnings.append(f"{label} skipped: the reference fails there ({ready['error']})")
            return True
        if msg["event"] != "trial_done" or msg.get("failed"):
            verdict.error = msg.get("failed") or msg.get("error", f"unexpected message {str(msg)[:200]}")
            return False
        verdict.warnings = list(dict.fromkeys(verdict.warnings + msg["warnings"]))
        for name, seconds in (("reference", ready["seconds"]), ("candidate", msg["seconds"])):
            verdict.phases_s[f"verify_{name}"] = round(verdict.phases_s.get(f"verify_{name}", 0.0) + seconds, 3)
        return self._check_outputs(ref, worker, ready, msg, label, deadline, verdict, errors)

    def _check_outputs(self, ref: ReferenceWorker, worker: WorkerProcess, ready: dict, msg: dict, label: str,
                       deadline: float, verdict: Verdict, errors: dict[str, list[float]]) -> bool:
        """The candidate's report on one call (inputs as it left them, its outputs) against the reference's."""
        try:  # the shared memory holding its outputs, whatever happens next
            fds = worker.receive_fds(min(int(msg.get("fds", 0)), 1 << 16), deadline)
        except (OSError, ValueError, TypeError) as exc:
            verdict.error = f"invalid output: {label}: the candidate did not hand its outputs over ({exc})"
            return False
        try:
            return self._compare(ref, ready, msg, label, fds, verdict, errors)
        finally:
            close_fds(fds)

    def _compare(self, ref: ReferenceWorker, ready: dict, msg: dict, label: str, fds: list[int], verdict: Verdict,
                 errors: dict[str, list[float]]) -> bool:
        verdict.policy_violations = list(dict.fromkeys(verdict.policy_violations + msg.get("violations", [])))
        expected = ready["checksums"]
        changed = [a.split(":")[0] for a, b in zip(msg["checksums_after"], expected) if a != b]
        if changed or len(msg["checksums_after"]) != len(expected):
            verdict.error = f"incorrect: {label}: {(changed or ['an input'])[0]} was modified in place by " \
                            "ModelNew.forward"
            return False
        if msg["problems"]:
            verdict.error = f"invalid output: {label}: {msg['problems'][0]}"
            return False
        if verdict.policy_violations:
            verdict.error = f"policy violation: {verdict.policy_violations[0]}"
            return False
        ref.send_fds(fds)
        compared = ref.call({"command": "compare", "manifest": msg.get("manifest"), "fds": len(fds), "label": label},
                            "compared", self.config.reference_timeout_s)
        verdict.phases_s["verify_compare"] = round(verdict.phases_s.get("verify_compare", 0.0) + compared["seconds"],
                                                   3)
        result = compared["result"]
        verdict.max_abs_error = max(verdict.max_abs_error or 0.0, result["max_abs"])
        verdict.max_rel_error = max(verdict.max_rel_error or 0.0, result["rel"])
        errors["candidate"] += result["rel64"]
        errors["eager"] += result["eager_rel64"]
        if not result["ok"]:
            verdict.error = f"incorrect: {result['reason']}"
            return False
        return True

    # ---- the trusted path (backend.trusted_clock): the reference worker drives and measures every call -----------
    def _attach(self, ref: ReferenceWorker, worker: WorkerProcess) -> bool | None:
        """Connect the candidate's worker to the reference worker by a socket of their own; the reference worker
        stops the candidate's process at once and from then on resumes it only inside its calls. Returns whether
        scaled inputs hold for the task (then every call's inputs are scaled by a factor drawn for it); None when
        the candidate left processes running (the verdict says so)."""
        found, launchers, strays = split_worker(worker.proc.pid, worker.sandbox is not None)
        if strays:
            return None
        cgroup = worker.sandbox.cgroup.procs[0] if worker.sandbox and worker.sandbox.cgroup else None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with ours, theirs:
            worker.send_fds([theirs.fileno()])
            worker.send({"command": "serve"})
            ref.send_fds([ours.fileno()])
            reply = ref.call({"command": "attach", "worker_pid": found, "others": launchers,
                              "cgroup": str(cgroup) if cgroup else None, "read_limit": READ_LIMIT}, "attached",
                             self.config.reference_timeout_s)
        return bool(reply["scales"])

    def _verify_trusted(self, task: Task, ref: ReferenceWorker, worker: WorkerProcess, seeds: list[int],
                        scales: bool, deadline: float, verdict: Verdict) -> bool:
        """Every input set, drawn, run and compared by the reference worker: the first at the task's own scale, the
        others (where the task holds there) scaled by a factor drawn for each, like every timed call's."""
        errors: dict[str, list[float]] = {"candidate": [], "eager": []}
        verdict.max_abs_error = verdict.max_rel_error = 0.0
        plan = [(f"input set {k}", seed, None, self._scale() if scales and k else None) for k, seed in enumerate(seeds)]
        shapes = self._extra_shape(task, ref, verdict)
        if shapes:
            plan.append((f"extra shape ({describe_sizes(shapes, task.source)})", secrets.randbelow(2**31), shapes,
                         None))
        if self.config.scaled_inputs:
            scale = 2 + 2 * secrets.randbelow(10**6) / 10**6
            plan.append((f"scaled inputs (x{scale:.3f})", secrets.randbelow(2**31), None, scale))
        for label, seed, sizes, scale in plan:
            reply = ref.call({"command": "check", "seed": seed, "shapes": sizes, "scale": scale, "label": label,
                              "budget_s": max(0.0, deadline - time.monotonic())}, "candidate_checked",
                             self.config.reference_timeout_s)
            if "skipped" in reply:
                verdict.warnings.append(f"{label} skipped: the reference fails there ({reply['skipped']})")
                continue
            verdict.phases_s["verify_candidate"] = round(verdict.phases_s.get("verify_candidate", 0.0)
                                                         + reply.get("call_us", 0.0) / 1e6, 3)
            if not reply["ok"]:
                verdict.error = self._call_failure(reply, worker)
                return False
            verdict.max_abs_error = max(verdict.max_abs_error or 0.0, reply["max_abs"])
            verdict.max_rel_error = max(verdict.max_rel_error or 0.0, reply["rel"])
            errors["candidate"] += reply["rel64"]
            errors["eager"] += reply["eager_rel64"]
        return self._precision(errors, verdict)

    def _trusted_timing(self, ref: ReferenceWorker, worker: WorkerProcess, deadline: float, verdict: Verdict):
        """The candidate's timing as the reference worker measures it (`TimingFailed` with the reason)."""

        def time_candidate(record: dict) -> dict:
            reply = ref.call({"command": "time_candidate", "timing": self._timing(), "checks": self.config.timed_checks,
                              "budget_s": max(0.0, deadline - time.monotonic())}, "candidate_checked",
                             self.config.reference_timeout_s)
            if not reply["ok"]:
                verdict.correct = False
                raise TimingFailed(self._call_failure(reply, worker))
            record["checked_calls"] += reply["stats"].pop("checked_calls")
            record["candidate_memory_peak"] = reply["stats"].pop("memory_peak")  # the kernel's, for scheduling
            return reply["stats"]

        return time_candidate

    def _detach(self, ref: ReferenceWorker, worker: WorkerProcess) -> None:
        """The candidate's calls are over: what its in-process audits reported (a policy violation fails it)."""
        reply = ref.call({"command": "detach", "end": True}, "detached", self.config.reference_timeout_s)
        if reply.get("error"):
            raise TimingFailed(self._call_failure({"reason": reply["error"], "failed": reply.get("failed")}, worker))
        if reply["violations"]:
            raise TimingFailed(f"policy violation: {reply['violations'][0]}", reply["violations"])

    @staticmethod
    def _call_failure(reply: dict, worker: WorkerProcess) -> str:
        """The reason for a failed call: how the candidate's process died or that it was killed at its deadline, or
        what the trusted side found."""
        how = reply.get("failed")
        if how == "timeout":
            worker.kill()
            return f"candidate process timed out after {time.monotonic() - worker.started:.0f}s (killed)"
        if how == "ended":
            try:
                worker.receive(time.monotonic() + 10)
            except WorkerDied as exc:
                return f"candidate process {exc}"
        reason = str(reply.get("reason"))
        return f"ModelNew.forward failed: {reason}" if how and not reason.startswith(("incorrect", "invalid")) \
            else reason

    @staticmethod
    def _scale() -> float:
        return math.exp(secrets.randbelow(10**6) / 10**6 * math.log(SCALE_MAX))

    def _worker_timing(self, ref: ReferenceWorker, worker: WorkerProcess, deadline: float, verdict: Verdict):
        """The candidate's timing as its own worker measures it (the cuda backend, until it has a trusted clock)."""
        check = self._timed_call_check(ref, worker, deadline, verdict)
        return lambda record: self.timekeeper.time_in_worker(worker, deadline, check, record)

    def _timed_call_check(self, ref: ReferenceWorker, worker: WorkerProcess, deadline: float, verdict: Verdict):
        """Checks the outputs of a timed call the timekeeper picked: the reference redraws its inputs from the seed."""

        def check(seed: int, label: str, exported: dict) -> bool:
            ready = ref.call({"command": "trial", "seed": seed, "fp64": False}, "trial_ready",
                             self.config.reference_timeout_s)
            if ready["checksums"] is None:
                verdict.error = f"incorrect: {label}: the reference failed there ({ready['error']})"
                return False
            ok = self._check_outputs(ref, worker, ready, exported, label, deadline, verdict,
                                     {"candidate": [], "eager": []})
            if not ok:
                verdict.correct = False
            return ok

        return check

    def _baseline_key(self, task: Task, verdict: Verdict) -> str:
        """Baselines are cached per (task, backend, device, torch version, timing settings)."""
        clock = "trusted-clock" if self.backend.trusted_clock else "in-process-clock"
        return "|".join([task.hash, self.backend.name, str(verdict.device), verdict.torch_version,
                         self.config.timing_key(), clock])

    # ---- helpers -------------------------------------------------------------------------------------
    def _timing(self) -> dict[str, Any]:
        c = self.config
        return {"warmup": c.warmup, "min_iters": c.min_iters, "max_iters": c.max_iters,
                "target_time_s": c.target_time_s}

    def _start_candidate(self, run_dir: Path) -> WorkerProcess:
        """A candidate worker for a run folder, started before its candidate is known (`spares.py`)."""
        return WorkerProcess("cuda_agent.judge.candidate_worker", {"spare": True, "backend": self.backend.name},
                             run_dir / "candidate", self._candidate_env(run_dir),
                             self._candidate_sandbox(run_dir))

    def _candidate_sandbox(self, run_dir: Path) -> sandbox.Sandbox | None:
        """The candidate sees its build, the public inputs and the task file; writes only its own folders."""
        if not self.sandboxed:
            return None
        compute = compute_packages() if self._blocks_compute_packages() else []  # numpy & co. cannot be imported
        view = sandbox.View(writable=[run_dir / "candidate"],
                            readable=[run_dir / "build", run_dir / "public", run_dir / "task", self.inline.root],
                            hidden=[self.cache_dir, *map(Path, compute)])
        return sandbox.Sandbox(view, self.limits, cwd=run_dir / "candidate")

    def _blocks_compute_packages(self) -> bool:
        """Strict policy on the trusted path. (The cuda backend's in-process path needs numpy in the candidate's
        process: torch reads CUDA array interfaces with it.)"""
        return self.config.policy == "strict" and self.backend.trusted_clock

    def _candidate_env(self, run_dir: Path) -> dict[str, str]:
        """Nothing the candidate writes is shared: its own torch extension and inductor folders."""
        private = Path("/tmp") if self.sandboxed else run_dir / "candidate"
        blocked = ",".join(COMPUTE_PACKAGES) if self._blocks_compute_packages() else ""
        return {**self._worker_env(), "CUDA_AGENT_BLOCKED_PACKAGES": blocked,
                "TORCHINDUCTOR_CACHE_DIR": str(private / "inductor"),
                "TORCH_EXTENSIONS_DIR": str(private / "torch_extensions"),
                **({"HOME": "/tmp", "TMPDIR": "/tmp"} if self.sandboxed else {})}

    def _worker_env(self) -> dict[str, str]:
        # Idle OpenMP threads sleep at once instead of spinning (both workers alike): after a call returns, a
        # thread that still burns CPU is then doing the candidate's work (candidate_worker.Guard).
        env = {"TORCHINDUCTOR_CACHE_DIR": str(self.cache_dir / "inductor"), "MAX_JOBS": str(os.cpu_count() or 1),
               "OMP_WAIT_POLICY": "PASSIVE"}
        if self.device is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(self.device)
        if self.compile_threads and "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ:
            env["TORCHINDUCTOR_COMPILE_THREADS"] = str(self.compile_threads)
        return {**env, **self.backend.worker_env()}
