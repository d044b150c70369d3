"""The judge: one object that turns (reference task, candidate) into a verdict with the milestone reward.

    judge = Judge("cuda")
    verdict = judge.evaluate("level1/19_ReLU.py", "my_workspace/")

One evaluation: scan the candidate's sources; build it (in the judge's process, from copies, with cached
objects) while a reference worker draws fresh inputs and computes reference outputs; time eager and
torch.compile unless cached for (task, device, torch version, settings); run the candidate in its own process
under the op audit; compare its outputs here; time it; reward. Every abnormal end is a verdict, not an exception;
only a broken reference (`TaskError`) or an unusable backend (`BackendError`) raises.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ..backend import Backend, BackendError, get_backend
from .. import sandbox
from ..task import Task, TaskError, extra_shape, load_task, shape_constants
from ..workspace.build import Builder, BuildResult
from ..workspace.candidate import Candidate, load_candidate
from .config import POLICIES, JudgeConfig
from .policy import scan_sources
from .process import WorkerDied, WorkerProcess
from .reward import milestone_reward
from .store import Store
from .verdict import Verdict

PRECISION_WARN_RATIO = 10.0


class ReferenceFailed(RuntimeError):
    """The reference worker failed after it had run the task once: the evaluation ends with a failure verdict."""


class Phases:
    """Wall time of each evaluation phase, recorded in the verdict (where an evaluation spends its time)."""

    def __init__(self, verdict: Verdict):
        self.verdict = verdict
        self.last = time.perf_counter()

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.verdict.phases_s[name] = round(now - self.last, 3)
        self.last = now


HOST_RATIO, HOST_SLACK_US = 3.0, 200.0  # host time per call beyond this much over device time fails
TORCH_KERNEL_PREFIXES = ("void at::", "at::", "void at_cuda_detail::", "void (anonymous namespace)::elementwise")


class Judge:
    def __init__(self, backend: str | Backend = "cuda", config: JudgeConfig | None = None):
        self.config = config or JudgeConfig()
        self.backend = get_backend(backend) if isinstance(backend, str) else backend
        self.backend.check_toolchain()
        if self.config.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {self.config.policy!r}")
        self.cache_dir = Path(self.config.cache_dir).expanduser().resolve()
        (self.cache_dir / "runs").mkdir(parents=True, exist_ok=True)
        self.builder = Builder(self.backend, self.cache_dir / "build")
        try:
            self.sandboxed = sandbox.resolve(self.config.sandbox)
        except (ValueError, RuntimeError) as exc:
            raise BackendError(str(exc)) from exc
        # CUDA IPC handles fail to open across the sandbox's namespaces (cudaErrorMapBufferObjectFailed, measured on
        # the H200 machine): sandboxed candidates hand their outputs over as files.
        self.cuda_ipc = self.backend.name == "cuda" and self.config.cuda_ipc and not self.sandboxed
        limit = self.config.memory_limit_gb
        self.limits = sandbox.Limits(memory_bytes=int(limit * 2**30) if limit else None,
                                     max_processes=self.config.max_processes,
                                     address_space=self.backend.name == "cpu")
        self.store = Store(self.cache_dir / "judge.sqlite")

    # ---- public --------------------------------------------------------------------------------------
    def evaluate(self, reference: str | Path | Task, candidate: str | Path | Candidate) -> Verdict:
        start = time.perf_counter()
        task = reference if isinstance(reference, Task) else load_task(reference)
        cand = candidate if isinstance(candidate, Candidate) else load_candidate(candidate)
        cfg = self.config
        seeds = list(cfg.seeds) if cfg.seeds else [secrets.randbelow(2**31) for _ in range(cfg.num_trials)]
        verdict = Verdict(
            reward=-1, compiled=False, correct=False, backend=self.backend.name, torch_version=torch.__version__,
            tolerance={"atol": cfg.atol, "rtol": cfg.rtol}, seeds=seeds,
            sandbox="namespaces (candidate not started)" if self.sandboxed else sandbox.NONE_DESCRIPTION,
            task={"name": task.name, "path": str(task.path), "hash": task.hash},
            candidate={"kind": cand.kind, "path": str(cand.origin), "hash": cand.hash})
        run_dir = Path(tempfile.mkdtemp(prefix=f"{task.name[:40]}-", dir=self.cache_dir / "runs"))
        try:
            self._evaluate(task, cand, seeds, run_dir, verdict)
        finally:
            if not cfg.keep_run_dirs:
                shutil.rmtree(run_dir, ignore_errors=True)
        verdict.seconds = round(time.perf_counter() - start, 3)
        return verdict

    # ---- steps ---------------------------------------------------------------------------------------
    def _evaluate(self, task: Task, cand: Candidate, seeds: list[int], run_dir: Path, verdict: Verdict) -> None:
        cfg = self.config
        public = run_dir / "public"
        public.mkdir()
        transfer = Path(tempfile.mkdtemp(prefix="cuda-agent-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK)
                                         else run_dir))
        ref = WorkerProcess("cuda_agent.judge.reference_worker", {
            "task_path": str(task.path), "backend": self.backend.name, "init_seed": secrets.randbelow(2**31),
            "allow_tf32": cfg.allow_tf32, "public_dir": str(public), "atol": cfg.atol, "rtol": cfg.rtol,
            "max_relative_error": cfg.max_relative_error,
            "compile_mode": cfg.compile_mode, "timing": self._timing(),
        }, run_dir / "reference", self._worker_env())
        worker: WorkerProcess | None = None
        phases = Phases(verdict)
        try:
            verdict.policy_violations = scan_sources(cand.text(), cfg.rules)
            build = self._build(cand, run_dir / "build")  # meanwhile the reference worker builds Model
            phases.mark("build")
            verdict.compiled = build.ok
            verdict.build = {"seconds": round(build.seconds, 3), "log": build.log[-20000:],
                             "steps": [{"source": s.source, "cached": s.cached, "seconds": round(s.seconds, 3)}
                                       for s in build.steps]}
            if build.ok and not verdict.policy_violations:  # starts while the reference worker is still busy
                worker = WorkerProcess("cuda_agent.judge.candidate_worker", {
                    "build_dir": str(build.build_dir), "kind": cand.kind, "backend": self.backend.name,
                    "task_path": str(task.path), "out_dir": str(transfer), "allow_tf32": cfg.allow_tf32,
                    "allowed_ops": list(cfg.rules.allowed_ops), "timing": self._timing(),
                    "extension_cache": str(self.cache_dir / "extensions"),
                    "cuda_ipc": self.cuda_ipc,
                }, run_dir / "candidate", self._candidate_env(), self._candidate_sandbox(task, run_dir, transfer,
                                                                                          verdict))
            msg = self._reference_message(task, ref, "ready", time.monotonic() + cfg.reference_timeout_s)
            phases.mark("reference_ready")
            verdict.device, verdict.torch_version, verdict.precision = \
                msg["device"], msg["torch_version"], msg["precision"]
            work = msg["work"]
            if not build.ok:
                verdict.error = build.error
                return
            if verdict.policy_violations or worker is None:
                verdict.error = f"policy violation: {verdict.policy_violations[0]}"
                return
            load_budget = cfg.build_timeout_s if cand.kind == "single_file" else cfg.run_timeout_s
            msg = worker.receive(time.monotonic() + load_budget)
            if msg["event"] == "loaded":
                worker.send({"command": "init", "public_dir": str(public)})
                msg = worker.receive(time.monotonic() + cfg.run_timeout_s)
            phases.mark("candidate_load")
            if msg["event"] not in ("loaded", "initialised"):
                verdict.compiled = msg["event"] != "load_error"
                verdict.error = msg.get("error", f"unexpected message {msg}")
                return
            verdict.compiled = True
            deadline = time.monotonic() + cfg.run_timeout_s
            if not self._verify(task, ref, worker, seeds, transfer, deadline, verdict):
                return
            phases.mark("verify")
            baselines = self._baselines(task, ref, verdict)
            phases.mark("baselines")
            worker.send({"command": "time", "seed": secrets.randbelow(2**31)})
            msg = worker.receive(deadline)
            phases.mark("time_candidate")
            if msg["event"] != "timed":
                verdict.correct, verdict.error = False, f"timing failed: {msg.get('error', msg)}"
                return
            # Fresh values in the very buffers it was timed on: a cache keyed on pointers or shapes returns stale
            # outputs here.
            recheck = {"command": "recheck", "k": len(seeds) + 2, "seed": secrets.randbelow(2**31)}
            if not self._trial(task, ref, worker, recheck, "re-check after timing (fresh values, same buffers)",
                               transfer, deadline, verdict, {"candidate": [], "eager": []}):
                verdict.correct = False
                return
            phases.mark("recheck")
            self._score(baselines, msg["stats"], work, verdict)
        except WorkerDied as exc:
            verdict.correct = False
            verdict.error = f"candidate process {exc}"
        except ReferenceFailed as exc:  # the reference ran before, so the candidate may be the cause (e.g. OOM)
            verdict.correct = False
            verdict.error = f"evaluation aborted: {exc}"
        finally:
            ref.close()
            if worker is not None:
                worker.close()
            shutil.rmtree(transfer, ignore_errors=True)

    def _build(self, cand: Candidate, build_dir: Path) -> BuildResult:
        if cand.kind == "single_file":  # load_inline builds inside the candidate worker
            build_dir.mkdir(parents=True)
            cand.write_to(build_dir)
            return BuildResult(True, build_dir, 0.0)
        return self.builder.build(cand, build_dir)

    def _reference_message(self, task: Task, ref: WorkerProcess, expected: str, deadline: float) -> dict[str, Any]:
        """The reference worker's next message. Before it is ready, a failure is the reference's own (TaskError,
        the user's error); afterwards it fails this evaluation (ReferenceFailed, a verdict)."""
        error = TaskError if expected == "ready" else ReferenceFailed
        try:
            msg = ref.receive(deadline)
        except WorkerDied as exc:
            raise error(f"reference {task.path}: the reference worker {exc}") from exc
        if msg["event"] != expected:
            raise error(f"reference {task.path}: {msg.get('error', msg)}")
        return msg

    def _verify(self, task: Task, ref: WorkerProcess, worker: WorkerProcess, seeds: list[int], transfer: Path,
                deadline: float, verdict: Verdict) -> bool:
        """Every input set in lockstep: reference outputs, candidate outputs, comparison on the reference side."""
        errors: dict[str, list[float]] = {"candidate": [], "eager": []}
        verdict.max_abs_error = verdict.max_rel_error = 0.0
        for k, seed in enumerate(seeds):
            if not self._trial(task, ref, worker, {"command": "trial", "k": k, "seed": seed}, f"input set {k}",
                               transfer, deadline, verdict, errors):
                return False
        shapes = extra_shape(shape_constants(task.source)) if self.config.extra_shapes else {}
        if shapes:
            label = "extra shape (" + ", ".join(f"{k}={v}" for k, v in shapes.items()) + ")"
            command = {"command": "trial", "k": len(seeds), "seed": secrets.randbelow(2**31), "shapes": shapes}
            if not self._trial(task, ref, worker, command, label, transfer, deadline, verdict, errors):
                return False
        if self.config.scaled_inputs:  # 2-4x the task's inputs: moments of its input distribution no longer hold
            scale = 2 + 2 * secrets.randbelow(10**6) / 10**6
            command = {"command": "trial", "k": len(seeds) + 1, "seed": secrets.randbelow(2**31), "scale": scale}
            if not self._trial(task, ref, worker, command, f"scaled inputs (x{scale:.3f})", transfer, deadline,
                               verdict, errors):
                return False
        verdict.correct = True
        if errors["candidate"] and errors["eager"]:
            c, e = max(errors["candidate"]), max(errors["eager"])
            ratio = (c + 1e-12) / (e + 1e-12)
            verdict.error_vs_fp64 = {"candidate": c, "eager_fp32": e, "ratio": ratio}
            limit = self.config.max_error_ratio
            finding = f"error vs fp64 is {ratio:.0f}x fp32 eager's ({c:.2e} vs {e:.2e})"
            if limit is not None and ratio > limit and c > 1e-6:
                verdict.correct = False
                verdict.error = f"precision: {finding}, above the limit of {limit:g}x"
                return False
            if ratio > PRECISION_WARN_RATIO and c > 1e-6:
                verdict.warnings.append(f"precision: {finding}; the candidate likely computes in lower precision "
                                        "(TF32/fp16/bf16)")
        return True

    def _trial(self, task: Task, ref: WorkerProcess, worker: WorkerProcess, command: dict[str, Any], label: str,
               transfer: Path, deadline: float, verdict: Verdict, errors: dict[str, list[float]]) -> bool:
        """One input set: the reference draws it and computes its outputs, the candidate runs on it (a fresh set,
        or fresh values written into the buffers it was timed on), the reference compares. False on failure."""
        ref.send({"command": "trial", "seed": command["seed"], "shapes": command.get("shapes"),
                  "scale": command.get("scale")})
        worker.send(command)
        ready = self._reference_message(task, ref, "trial_ready", time.monotonic() + self.config.reference_timeout_s)
        msg = worker.receive(deadline)
        if ready["checksums"] is None:  # the task itself does not hold at these sizes: nothing to check
            verdict.warnings.append(f"{label} skipped: the reference fails there ({ready['error']})")
            return True
        if msg["event"] != "trial_done":
            verdict.error = msg.get("error", f"unexpected message {msg}")
            return False
        verdict.policy_violations = list(dict.fromkeys(verdict.policy_violations + msg["violations"]))
        verdict.warnings = list(dict.fromkeys(verdict.warnings + msg["warnings"]))
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
        manifest = transfer / f"trial{command['k']}.json"  # the judge's own path, whatever the worker says
        ref.send({"command": "compare", "manifest": str(manifest), "label": label})
        compared = self._reference_message(task, ref, "compared", time.monotonic() + self.config.reference_timeout_s)
        shutil.rmtree(manifest.with_suffix(""), ignore_errors=True)
        for name, seconds in (("reference", ready["seconds"]), ("candidate", msg["seconds"]),
                              ("compare", compared["seconds"])):
            key = f"verify_{name}"
            verdict.phases_s[key] = round(verdict.phases_s.get(key, 0.0) + seconds, 3)
        result = compared["result"]
        verdict.max_abs_error = max(verdict.max_abs_error or 0.0, result["max_abs"])
        verdict.max_rel_error = max(verdict.max_rel_error or 0.0, result["rel"])
        errors["candidate"] += result["rel64"]
        errors["eager"] += result["eager_rel64"]
        if not result["ok"]:
            verdict.error = f"incorrect: {result['reason']}"
            return False
        return True

    def _baselines(self, task: Task, ref: WorkerProcess, verdict: Verdict) -> dict[str, Any]:
        """Eager and torch.compile timings: cached per (task, device, torch version, settings), else measured."""
        key = "|".join([task.hash, self.backend.name, str(verdict.device), verdict.torch_version,
                        self.config.timing_key()])
        cached = self.store.get("baselines", key)
        if cached is not None:
            return {**cached, "cached": True}
        ref.send({"command": "time", "seed": secrets.randbelow(2**31)})
        msg = self._reference_message(task, ref, "baselines", time.monotonic() + self.config.reference_timeout_s)
        baselines = {"eager": msg["eager"], "compile": msg["compile"], "compile_error": msg["compile_error"]}
        self.store.put("baselines", key, baselines)
        return {**baselines, "cached": False}

    def _score(self, baselines: dict[str, Any], stats: dict[str, Any], work: dict[str, Any],
               verdict: Verdict) -> None:
        t_eager = baselines["eager"]["median_us"]
        t_compile = baselines["compile"]["median_us"] if baselines["compile"] else None
        if t_compile is None:
            verdict.warnings.append(f"torch.compile failed on the reference ({baselines['compile_error']}); "
                                    "the compile baseline is eager")
            t_compile = t_eager
        t = stats["median_us"]
        verdict.times_us = {"eager": t_eager, "compile": t_compile, "candidate": t}
        verdict.speedup_vs_eager = t_eager / t if t > 0 else None
        verdict.speedup_vs_compile = t_compile / t if t > 0 else None
        verdict.reward = milestone_reward(True, t, t_eager, t_compile, self.config.speedup_threshold)
        verdict.timing = {"method": self.backend.timing_method, "baseline_cached": baselines["cached"],
                          "eager": baselines["eager"], "compile": baselines["compile"], "candidate": stats}
        verdict.timing["work"] = work
        peaks = self.config.device_peaks or self.backend.peak_rates(str(verdict.device))
        if peaks:
            bound = max(work["bytes"] / peaks[0], (work["flops"] or 0) / peaks[1]) * 1e6
            verdict.timing["speed_of_light_us"] = bound
            if t < bound:
                verdict.warnings.append(
                    f"faster than the speed of light: {t:.1f} us < {bound:.1f} us for {work['bytes']} bytes and "
                    f"{work['flops']} FLOPs at this device's peak rates; the measurement or the candidate is suspect")
        problem = self._timeline_problem(stats, t)
        if problem:
            verdict.correct, verdict.reward, verdict.error = False, -1, problem

    def _timeline_problem(self, stats: dict[str, Any], t: float) -> str | None:
        """The work must happen on the timed device timeline, in the candidate's own kernels (GPU)."""
        host = stats["host_median_us"]
        if self.backend.name == "cpu":
            return None
        if host > HOST_RATIO * t + HOST_SLACK_US:
            return (f"host-side work: the host wall clock per call ({host:.0f} us) far exceeds the device time "
                    f"({t:.0f} us); compute must run on the GPU, inside the timed calls")
        kernels = stats.get("kernels") or []
        if not [k for k in kernels if not k.startswith(TORCH_KERNEL_PREFIXES)]:
            return ("none of the candidate's own kernels ran in the timed calls (seen: "
                    f"{', '.join(k[:60] for k in kernels) or 'no kernel at all'})")
        return None

    # ---- helpers -------------------------------------------------------------------------------------
    def _timing(self) -> dict[str, Any]:
        c = self.config
        return {"warmup": c.warmup, "min_iters": c.min_iters, "max_iters": c.max_iters,
                "target_time_s": c.target_time_s}

    def _candidate_sandbox(self, task: Task, run_dir: Path, transfer: Path,
                           verdict: Verdict) -> sandbox.Sandbox | None:
        """The candidate sees its build, the public inputs and the task file; writes only its own folders."""
        if not self.sandboxed:
            return None
        for sub in ("candidate", "build"):
            (run_dir / sub).mkdir(exist_ok=True)
        extensions = self.cache_dir / "extensions"
        extensions.mkdir(exist_ok=True)
        view = sandbox.View(writable=[run_dir / "candidate", transfer, extensions],
                            readable=[run_dir / "build", run_dir / "public", task.path],
                            hidden=[self.cache_dir])
        box = sandbox.Sandbox(view, self.limits, cwd=run_dir / "candidate")
        verdict.sandbox = box.describe() + ("; outputs cross as files (no CUDA IPC across namespaces)"
                                            if self.backend.name == "cuda" else "")
        return box

    def _candidate_env(self) -> dict[str, str]:
        if not self.sandboxed:
            return self._worker_env()
        private = {"HOME": "/tmp", "TMPDIR": "/tmp", "TORCHINDUCTOR_CACHE_DIR": "/tmp/inductor"}
        return {**self._worker_env(), **private}

    def _worker_env(self) -> dict[str, str]:
        env = {"TORCHINDUCTOR_CACHE_DIR": str(self.cache_dir / "inductor"),
               "TORCH_EXTENSIONS_DIR": str(self.cache_dir / "extensions"),
               "MAX_JOBS": str(os.cpu_count() or 1)}
        return {**env, **self.backend.worker_env()}
