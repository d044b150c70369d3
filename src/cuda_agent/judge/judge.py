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

from ..backend import Backend, get_backend
from ..task import Task, TaskError, load_task
from ..workspace.build import Builder, BuildResult
from ..workspace.candidate import Candidate, load_candidate
from .compare import Comparison, compare, inputs_unchanged, relative_error
from .config import JudgeConfig
from .policy import scan_sources
from .process import WorkerDied, WorkerProcess
from .reward import milestone_reward
from .store import Store
from .tensors import leaves
from .verdict import Verdict

PRECISION_WARN_RATIO = 10.0


class Judge:
    def __init__(self, backend: str | Backend = "cuda", config: JudgeConfig | None = None):
        self.config = config or JudgeConfig()
        self.backend = get_backend(backend) if isinstance(backend, str) else backend
        self.backend.check_toolchain()
        self.cache_dir = Path(self.config.cache_dir)
        (self.cache_dir / "runs").mkdir(parents=True, exist_ok=True)
        self.builder = Builder(self.backend, self.cache_dir / "build")
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
        public, private, outputs = (run_dir / d for d in ("public", "private", "outputs"))
        for d in (public, private, outputs):
            d.mkdir()
        ref = WorkerProcess("cuda_agent.judge.reference_worker", {
            "task_path": str(task.path), "backend": self.backend.name, "seeds": seeds,
            "init_seed": secrets.randbelow(2**31), "allow_tf32": cfg.allow_tf32, "public_dir": str(public),
            "private_dir": str(private), "compile_mode": cfg.compile_mode, "timing": self._timing(),
        }, run_dir / "reference", self._worker_env())
        try:
            verdict.policy_violations = scan_sources(cand.text(), cfg.policy)
            build = self._build(cand, run_dir / "build")  # meanwhile the reference worker computes outputs
            verdict.compiled = build.ok
            verdict.build = {"seconds": round(build.seconds, 3), "log": build.log[-20000:],
                             "steps": [{"source": s.source, "cached": s.cached, "seconds": round(s.seconds, 3)}
                                       for s in build.steps]}
            baselines = self._reference(task, ref, verdict)
        finally:
            ref.close()
        if not build.ok:
            verdict.error = build.error
            return
        if verdict.policy_violations:
            verdict.error = f"policy violation: {verdict.policy_violations[0]}"
            return
        self._run_candidate(cand, build, public, private, outputs, run_dir, baselines, verdict)

    def _build(self, cand: Candidate, build_dir: Path) -> BuildResult:
        if cand.kind == "single_file":  # load_inline builds inside the candidate worker
            build_dir.mkdir(parents=True)
            cand.write_to(build_dir)
            return BuildResult(True, build_dir, 0.0)
        return self.builder.build(cand, build_dir)

    def _reference(self, task: Task, ref: WorkerProcess, verdict: Verdict) -> dict[str, Any]:
        """Wait for the reference outputs; return baseline timings (cached, or measured now)."""
        deadline = time.monotonic() + self.config.reference_timeout_s
        try:
            msg = ref.receive(deadline)
            if msg["event"] != "ready":
                raise TaskError(f"reference {task.path}: {msg.get('error', msg)}")
            verdict.device, verdict.torch_version, verdict.precision = \
                msg["device"], msg["torch_version"], msg["precision"]
            key = "|".join([task.hash, self.backend.name, msg["device"], msg["torch_version"],
                            self.config.timing_key()])
            cached = self.store.get("baselines", key)
            if cached is not None:
                ref.send({"command": "exit"})
                return {**cached, "cached": True}
            ref.send({"command": "time"})
            msg = ref.receive(deadline)
            if msg["event"] != "baselines":
                raise TaskError(f"reference {task.path}: timing failed: {msg.get('error', msg)}")
        except WorkerDied as exc:
            raise TaskError(f"reference {task.path}: the reference worker {exc}") from exc
        baselines = {"eager": msg["eager"], "compile": msg["compile"], "compile_error": msg["compile_error"]}
        self.store.put("baselines", key, baselines)
        return {**baselines, "cached": False}

    def _run_candidate(self, cand: Candidate, build: BuildResult, public: Path, private: Path, outputs: Path,
                       run_dir: Path, baselines: dict[str, Any], verdict: Verdict) -> None:
        cfg = self.config
        worker = WorkerProcess("cuda_agent.judge.candidate_worker", {
            "build_dir": str(build.build_dir), "kind": cand.kind, "backend": self.backend.name,
            "public_dir": str(public), "out_dir": str(outputs), "allow_tf32": cfg.allow_tf32,
            "allowed_ops": list(cfg.policy.allowed_ops), "timing": self._timing(),
            "extension_cache": str(self.cache_dir / "extensions"),
        }, run_dir / "candidate", self._worker_env())
        budget = cfg.run_timeout_s + (cfg.build_timeout_s if cand.kind == "single_file" else 0)
        deadline = time.monotonic() + budget
        try:
            msg = worker.receive(deadline)
            if msg["event"] == "load_error":
                verdict.compiled, verdict.error = False, msg["error"]
                return
            verdict.compiled = True
            if msg["event"] != "verified":
                verdict.error = msg.get("error", f"unexpected message {msg}")
                return
            verdict.policy_violations += msg["violations"]
            comparison = self._compare(private, outputs, public, msg["trials"], verdict)
            failure = (msg["problems"] and f"invalid output: {msg['problems'][0]}") or \
                (verdict.policy_violations and f"policy violation: {verdict.policy_violations[0]}") or \
                (not comparison.ok and f"incorrect: {comparison.reason}")
            if failure:
                verdict.error = failure
                return
            verdict.correct = True
            worker.send({"command": "time"})
            msg = worker.receive(time.monotonic() + cfg.run_timeout_s)
            if msg["event"] != "timed":
                verdict.correct, verdict.error = False, f"timing failed: {msg.get('error', msg)}"
                return
            self._score(baselines, msg["stats"], verdict)
        except WorkerDied as exc:
            verdict.correct = False
            verdict.error = f"candidate process {exc}"
        finally:
            worker.close()

    def _compare(self, private: Path, outputs: Path, public: Path, trials: int, verdict: Verdict) -> Comparison:
        ref = torch.load(private / "reference.pt", weights_only=True)
        inputs = torch.load(public / "inputs.pt", weights_only=True)["inputs"]
        result = Comparison()
        eager_errors = []
        for k in range(len(ref["outputs"])):
            if k >= trials or not (outputs / f"trial{k}.pt").exists():
                return result.fail(f"no output for input set {k}")
            try:
                got = torch.load(outputs / f"trial{k}.pt", weights_only=True)
            except Exception as exc:
                return result.fail(f"input set {k}: outputs could not be read safely ({type(exc).__name__})")
            changed = inputs_unchanged(inputs[k], got["inputs_after"])
            if changed:
                return result.fail(f"input set {k}: {changed}")
            compare(got["outputs"], ref["outputs"][k], ref["outputs64"][k], self.config.atol, self.config.rtol,
                    result, f"input set {k}")
            if not result.ok:
                break
            if ref["outputs64"][k] is not None:
                ref64 = dict(leaves(ref["outputs64"][k]))
                eager_errors += [relative_error(t, ref64[p]) for p, t in leaves(ref["outputs"][k])
                                 if isinstance(t, torch.Tensor) and t.is_floating_point() and p in ref64]
        verdict.max_abs_error = result.max_abs_error
        verdict.max_rel_error = result.max_rel_error
        if result.ok and result.errors_vs_fp64 and eager_errors:
            cand_err, eager_err = max(result.errors_vs_fp64), max(eager_errors)
            ratio = (cand_err + 1e-12) / (eager_err + 1e-12)
            verdict.error_vs_fp64 = {"candidate": cand_err, "eager_fp32": eager_err, "ratio": ratio}
            if ratio > PRECISION_WARN_RATIO and cand_err > 1e-6:
                verdict.warnings.append(
                    f"precision: error vs fp64 is {ratio:.0f}x fp32 eager's ({cand_err:.2e} vs {eager_err:.2e}); "
                    "the candidate likely computes in lower precision (TF32/fp16/bf16)")
        return result

    def _score(self, baselines: dict[str, Any], stats: dict[str, Any], verdict: Verdict) -> None:
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
        if stats["host_median_us"] > 2 * t + 100:
            verdict.warnings.append(
                f"host wall clock ({stats['host_median_us']:.0f} us) far exceeds device time ({t:.0f} us): "
                "work may run outside the measured device timeline")

    # ---- helpers -------------------------------------------------------------------------------------
    def _timing(self) -> dict[str, Any]:
        c = self.config
        return {"warmup": c.warmup, "min_iters": c.min_iters, "max_iters": c.max_iters,
                "target_time_s": c.target_time_s}

    def _worker_env(self) -> dict[str, str]:
        env = {"TORCHINDUCTOR_CACHE_DIR": str(self.cache_dir / "inductor"),
               "TORCH_EXTENSIONS_DIR": str(self.cache_dir / "extensions"),
               "MAX_JOBS": str(os.cpu_count() or 1)}
        arch = getattr(self.backend, "arch", "")
        if arch:  # load_inline builds for this GPU only
            env["TORCH_CUDA_ARCH_LIST"] = f"{arch[:-1]}.{arch[-1]}" if arch[-1].isdigit() else \
                f"{arch[:-2]}.{arch[-2:]}"
        return env
