"""One evaluation, phase by phase: the state of one (task, candidate) on its way to a verdict.

    build -> reference ready -> load -> begin -> verify -> baseline compile -> time -> score

The candidate is built (from copies, with cached objects, compilers sandboxed) while a reference worker starts and
builds `Model`; the candidate's worker loads it; both construct their modules with fresh weights; the candidate
is verified on every input set and timed beside eager and torch.compile along one of two paths
(`verification.py`); the verdict is scored (`scoring/`). Each phase's wall time is recorded in the verdict.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from ..task import Task, TaskError
from ..workspace.build import BuildResult
from ..workspace.candidate import Candidate
from ..workspace.inline import InlineError
from .checks.policy import scan_sources
from .checks.symbols import library_problems
from . import kernelbench_timing
from .in_process_path import InProcessPath
from .memory_budget import evaluation_need
from .references import ReferenceFailed, ReferenceWorker
from .scoring.score import score
from .spares import Slot
from .timekeeper import TimingFailed, TimingOutcome
from .trusted_path import TrustedPath
from .verdict import OUT_OF_TIME, Verdict
from .verification import CandidatePath
from .wire.process import WorkerDied, WorkerProcess

if TYPE_CHECKING:
    from .judge import Judge

RUNTIME_OPS = "runtime ops (strict would fail)"  # a kernelbench verdict's finding of the op audit (`audit_call`)


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


class OutOfTime(Exception):
    """The caller's deadline came before the next phase."""


class Evaluation:
    def __init__(self, judge: Judge, task: Task, cand: Candidate, seeds: list[int], verdict: Verdict, slot: Slot,
                 alone: bool, deadline: float = float("inf")):
        """`alone`: nothing else runs on the device from the moment the reference is this evaluation's to the
        verdict. `deadline` (time.monotonic): the caller's (an episode's time limit); every wait on the candidate
        (its builds, its process) and on torch.compile's baseline ends there and no phase starts after it; the
        reference's other work is bounded by its timeout."""
        self.judge, self.cfg = judge, judge.config
        self.task, self.cand, self.seeds, self.verdict, self.slot, self.alone = task, cand, seeds, verdict, slot, alone
        self.deadline = deadline
        self.phases = Phases(verdict, judge.on_phase)
        self.ref: ReferenceWorker
        self.worker: WorkerProcess | None = None
        self.second_worker = False  # the judged worker replaced by a fresh one (kernelbench_timing.second_worker)
        self.build: BuildResult | None = None
        self.weights = 0  # tensors in Model's state dict (the reference's `begun`)
        # seconds left to the candidate's load and construction (`_candidate_step`, the time spent waiting on it):
        # the two share one `run_timeout_s + build_budget_s` (each had its own, twice the bound; red team 2026-12-06)
        self.loading_left = self.cfg.run_timeout_s + self.cfg.build_budget_s
        # its processes' device memory before they allocate: reference, candidate and (trusted path) baseline callee
        self.contexts = (2 + judge.backend.trusted_clock) * judge.backend.process_memory

    def run(self) -> None:
        """The evaluation under the judge's memory budget: what this task is known to need is held throughout; a
        task never judged here holds its reference's guess from its first device phase (`_guessed`)."""
        judge, cfg = self.judge, self.cfg
        request = {"backend": judge.backend.name, "allow_tf32": cfg.allow_tf32, "atol": cfg.atol, "rtol": cfg.rtol,
                   "max_relative_error": cfg.max_relative_error, "compile_mode": cfg.compile_mode,
                   "timing": judge.timing(), "trusted_clock": judge.backend.trusted_clock,
                   "scaled_inputs": cfg.scaled_inputs, "output_pool": judge.output_pool, "policy": cfg.policy,
                   "sample_period_ns": judge.sample_period_ns()}
        key = "|".join([self.task.hash, judge.backend.name, self.verdict.torch_version])
        known = judge.store.get("memory", key) or {}
        if known:
            judge.memory.learn(known["total"])
        need = evaluation_need(known, self.contexts)
        with judge.memory.hold(need):
            if known:  # (its own phase: the build's starts after it)
                self.phases.mark("memory_queued")
            with judge.references.reserve(self.task, request, judge.worker_env()) as self.ref:  # a cold one starts
                self._phases(guess=not need and not self.alone)
        said = min((self.verdict.timing.get("baselines") or {}).get("candidate_memory_peak", 0), self.ref.device_total)
        learnt = {"peak": max(self.ref.peak, known.get("peak", 0)),
                  "total": self.ref.device_total or known.get("total", 0),
                  **({"candidate": max(said, known.get("candidate", 0))} if said or "candidate" in known else {})}
        if self.ref.peak and learnt != known:
            judge.store.put("memory", key, learnt)
            judge.memory.learn(learnt["total"])

    def until(self, seconds: float) -> float:
        """The deadline of a wait of `seconds` from now, cut at the caller's."""
        return min(time.monotonic() + seconds, self.deadline)

    def in_time(self) -> None:
        """Between phases: OutOfTime when the caller's deadline has come."""
        if time.monotonic() >= self.deadline:
            raise OutOfTime

    def _phases(self, guess: bool) -> None:
        cut = False
        try:
            self._all_phases(guess)
        except OutOfTime:
            self.verdict.correct, cut = False, True
        if cut or self.verdict.error and time.monotonic() >= self.deadline:
            # a failure at the caller's deadline is the deadline's (a candidate cut short is not judged wrong)
            why = f": {self.verdict.error}" if self.verdict.error else ""
            done = ", ".join(p for p in self.verdict.phases_s if not p.endswith("queued")) or "none"
            self.verdict.error = f"{OUT_OF_TIME}: the caller's time limit came before the verdict (phases done: " \
                                 f"{done}){why}"

    def _all_phases(self, guess: bool) -> None:
        try:
            self.in_time()
            self.build_candidate()
            self.in_time()
            ready = self.reference_ready()
            if not self.load():
                return
            if ready.get("memory_total"):
                self.judge.memory.learn(ready["memory_total"])
            # from here on its guessed memory, the reference and then the device are this evaluation's (always in
            # this order: no evaluation waits for one while it holds one after it)
            with self._guessed(ready.get("memory_guess", 0) + self.contexts if guess else 0), self.ref.lease(), \
                    self._alone():
                self.phases.mark("reference_queued")
                self.in_time()
                begun = self.begin()
                outcome = self.verify_and_time() if begun is not None else None
                if outcome is not None and self.cfg.timing != "ours":
                    self.verdict.kernelbench_timing = kernelbench_timing.measure(self)
                    self.phases.mark("kernelbench_timing")
                if outcome is not None and self.cfg.policy == "kernelbench":
                    self.audit_call()
            if outcome is not None:
                self.score(outcome, begun["work"])
        except WorkerDied as exc:
            self.verdict.correct = False
            self.verdict.error = f"candidate process {exc}"
        except ReferenceFailed as exc:  # the reference ran before, so the candidate may be the cause (e.g. OOM)
            self.verdict.correct = False
            self.verdict.error = f"evaluation aborted: {exc}"

    # ---- the phases --------------------------------------------------------------------------------------
    def build_candidate(self) -> None:
        """Scan the sources, build (meanwhile the reference worker builds `Model`), and send the spare
        worker its candidate, which then loads while the reference worker is still busy."""
        verdict, cfg = self.verdict, self.cfg
        self.violated(scan_sources(self.cand.text(), cfg.rules))
        run_dir = self.slot.run_dir
        build = self.build = self._build(run_dir / "build")
        self.phases.mark("build")
        verdict.compiled = build.ok
        verdict.build = {"seconds": round(build.seconds, 3), "log": build.log[-20000:],
                         "steps": [{"source": s.source, "cached": s.cached, "seconds": round(s.seconds, 3)}
                                   for s in build.steps]}
        if not build.ok or verdict.policy_violations:
            return
        task_file = run_dir / "task" / self.task.path.name  # the candidate's view holds this folder
        task_file.write_text(self.task.source)
        self.worker = self.slot.worker
        self.worker.send({"request": self.candidate_request()})
        if self.worker.sandbox:
            verdict.sandbox = self.worker.sandbox.describe()

    def candidate_request(self, **changed: Any) -> dict[str, Any]:
        """What the candidate's worker is told to load and how (`changed`: a second worker's differences)."""
        judge, cfg = self.judge, self.cfg
        return {"build_dir": str(self.build.build_dir), "kind": self.cand.kind, "backend": judge.backend.name,
                "task_path": str(self.slot.run_dir / "task" / self.task.path.name), "allow_tf32": cfg.allow_tf32,
                "allowed_ops": list(cfg.rules.allowed_ops), "audit_ops": cfg.policy == "strict",
                "timing": judge.timing(), "sandboxed": judge.sandboxed, "trusted_inputs": judge.backend.trusted_clock,
                "output_pool": judge.output_pool, "policy": cfg.policy, **changed}

    def reference_ready(self) -> dict[str, Any]:
        ready = self.ref.wait_ready(self.cfg.reference_timeout_s)
        self.phases.mark("reference_ready")
        self.verdict.device, self.verdict.torch_version, self.verdict.precision = \
            ready["device"], ready["torch_version"], ready["precision"]
        return ready

    def load(self) -> bool:
        verdict = self.verdict
        if not self.build.ok:
            verdict.error = self.build.error
            return False
        if verdict.policy_violations or self.worker is None:
            verdict.error = f"policy violation: {verdict.policy_violations[0]}"
            return False
        self.in_time()
        loaded = self._candidate_step("loaded")
        self.phases.mark("candidate_load")
        return loaded is not None

    def begin(self) -> dict[str, Any] | None:
        """Both sides construct their modules, with the same fresh weights; None when the candidate failed."""
        with self.judge.device_lock.shared():  # its first one runs Model on the device
            self.phases.mark("begin_queued")
            # a worker that has begun before fails for reasons not the task's (a context an earlier candidate broke)
            begun = self.ref.call({"command": "begin", "init_seed": secrets.randbelow(2**31),
                                   "public_dir": str(self.slot.run_dir / "public")}, "begun",
                                  self.cfg.reference_timeout_s, ReferenceFailed if self.ref.begun else TaskError)
            self.ref.begun += 1
            self.weights = begun["weights"]
            self.phases.mark("reference_begin")
        self.worker.send({"command": "init", "public_dir": str(self.slot.run_dir / "public")})
        initialised = self._candidate_step("initialised")
        self.phases.mark("candidate_init")
        if initialised is None:
            return None
        self.verdict.compiled = True
        self.verdict.warnings += initialised.get("warnings", [])
        self.verdict.strict_findings += initialised.get("findings", [])
        return begun

    def audit_call(self) -> None:
        """(kernelbench policy, after the verdict) strict's op audits on one more call of the candidate's, in the
        second worker KernelBench's timing used or a fresh one (the judged worker's calls are KernelBench's alone: a
        candidate that counts its calls sees none added): the torch ops it ran, as findings."""
        try:
            ready = {} if self.second_worker else kernelbench_timing.second_worker(self)
            if "error" in ready:
                self.verdict.warnings.append(f"the op audit's call did not run: {ready['error']}")
                return
            with self.judge.device_lock.shared():  # (device work: never beside a timed run)
                self.worker.send({"command": "audit"})
                audited = self.worker.receive(self.until(self.cfg.run_timeout_s))
        except WorkerDied as exc:
            self.verdict.warnings.append(f"the op audit's call did not run: candidate process {exc}")
            return
        self.phases.mark("audit_call")
        findings = audited.get("findings") if audited.get("event") == "audited" else None
        if not isinstance(findings, list):
            self.verdict.warnings.append(f"the op audit's call did not run: {str(audited.get('error', audited))[:300]}")
            return
        # (the candidate's own report: as many and as long as a verdict should hold)
        self.verdict.strict_findings += [f"{RUNTIME_OPS}: {str(f)[:500]}" for f in findings[:20]]

    def verify_and_time(self) -> TimingOutcome | None:
        """Verification beside other evaluations' shared device work (their compiles' runs, their verifications),
        never beside a timed run; then timing, with the device to itself. None when the candidate failed (the
        verdict says why)."""
        judge, cfg, verdict = self.judge, self.cfg, self.verdict
        path: CandidatePath = TrustedPath(self) if judge.backend.trusted_clock else InProcessPath(self)
        baseline_key = judge.baseline_key(self.task, verdict)
        try:
            if not path.attach():
                return None
            with judge.device_lock.shared():
                self.phases.mark("verify_queued")
                self.in_time()
                deadline = self.until(cfg.run_timeout_s)
                if not path.verify(deadline):
                    return None
                self.phases.mark("verify")
            if judge.store.get("baselines", baseline_key) is None:  # torch.compile's baseline, for correct ones only
                self.in_time()
                began = time.monotonic()
                unlocked = judge.compile_baseline(self.ref, self.deadline)
                self.phases.mark("baseline_compile")
                deadline += time.monotonic() - began
                if unlocked:
                    verdict.phases_s["baseline_compile_unlocked"] = round(unlocked, 3)
            waiting = time.monotonic()
            with judge.device_lock.exclusive():
                self.phases.mark("device_queued")
                self.in_time()
                # the candidate's time does not run while it waits (the caller's does)
                deadline = min(deadline + time.monotonic() - waiting, self.deadline)
                try:
                    outcome = judge.timekeeper.run(
                        baseline_key, lambda command, event: self.ref.call(command, event, cfg.reference_timeout_s),
                        path.time_candidate(deadline))
                    path.finish()
                except TimingFailed as exc:
                    verdict.correct = False
                    verdict.policy_violations += exc.violations
                    verdict.error = verdict.error or str(exc)
                    return None
                self.phases.mark("timing")
            return outcome
        finally:
            path.close()

    def score(self, outcome: TimingOutcome, work: Any) -> None:
        judge = self.judge
        peaks = self.cfg.device_peaks or judge.backend.peak_rates(str(self.verdict.device))
        score(self.cfg, judge.backend.timing_method, outcome, work, peaks, self.verdict)

    # ---- helpers -----------------------------------------------------------------------------------------
    @contextmanager
    def _alone(self) -> Iterator[None]:
        if not self.alone:
            yield
            return
        with self.judge.device_lock.exclusive():
            self.judge.references.drop_idle()  # their device memory too
            yield

    @contextmanager
    def _guessed(self, need: int) -> Iterator[None]:
        """A task never judged here: its reference's guess held in the memory budget (the wait: memory_queued)."""
        with self.judge.memory.hold(need):
            if need:
                self.phases.mark("memory_queued")
            yield

    def _build(self, build_dir: Path) -> BuildResult:
        """A workspace is built here, and its library's symbols checked (strict); a single file's `load_inline`
        calls are built when its worker asks (`serve_builds`)."""
        if self.cand.kind == "single_file":
            build_dir.mkdir(parents=True, exist_ok=True)
            self.cand.write_to(build_dir)
            return BuildResult(True, build_dir, 0.0)
        build = self.judge.builder.build(self.cand, build_dir, self.deadline)
        if build.ok:
            self.violated(library_problems(build.module_path, self.cfg.rules.allowed_ops), "native code")
        return build

    def violated(self, found: list[str], kind: str = "") -> None:
        """What the trusted side's own checks of the sources and the built library found (`kind`: the check's name
        in strict's messages, where they name it): strict's policy violations, or under the kernelbench policy
        (torch ops allowed) what strict would say."""
        if self.cfg.policy == "strict":
            self.verdict.policy_violations += [f"{kind}: {v}" if kind else v for v in found]
        else:
            self.verdict.strict_findings += [f"{kind or 'source'} (strict would fail): {v}" for v in found]

    def _candidate_step(self, expected: str) -> dict[str, Any] | None:
        """The candidate's next message (its load_inline builds served on the way); None when it failed or broke the
        policy there (the verdict says which)."""
        verdict = self.verdict
        began = time.monotonic()
        try:
            msg = self.serve_builds(deadline=self.until(self.loading_left))
        finally:
            self.loading_left -= time.monotonic() - began
        verdict.policy_violations = list(dict.fromkeys(verdict.policy_violations + msg.get("violations", [])))
        if verdict.policy_violations:
            verdict.error = f"policy violation: {verdict.policy_violations[0]}"
        elif msg["event"] != expected:
            verdict.compiled = msg["event"] != "load_error"
            verdict.error = msg.get("error", f"unexpected message {str(msg)[:200]}")
        else:
            return msg
        return None

    def serve_builds(self, inline: list[dict] | None = None, deadline: float | None = None) -> dict[str, Any]:
        """The worker's next message, building the `load_inline` calls it asks for on the way (workspace/inline.py),
        each recorded in `inline` (default: the verdict's build record). The evaluation's builds share one budget:
        at most `max_builds` calls and `build_budget_s` seconds with the workspace's build, each call's build stopped
        when the budget is spent. The worker has `run_timeout_s` plus the build budget from now, builds included:
        nothing is added back."""
        cfg, verdict, worker = self.cfg, self.verdict, self.worker
        deadline = self.until(cfg.run_timeout_s + cfg.build_budget_s) if deadline is None else deadline
        while True:
            msg = worker.receive(deadline)
            if msg.get("event") != "build":
                return msg
            inline = verdict.build.setdefault("inline", []) if inline is None else inline
            spent = verdict.build.get("seconds", 0.0) + sum(b.get("seconds", 0.0) for b in inline)
            left = min(cfg.build_budget_s - spent, deadline - time.monotonic())
            if len(inline) >= cfg.max_builds or left <= 0:
                error = (f"load_inline: the evaluation's build budget is spent ({len(inline)} builds, {spent:.0f} s; "
                         f"at most {cfg.max_builds} builds and {cfg.build_budget_s:.0f} s)")
                inline.append({"error": error, "seconds": 0.0})
                worker.send({"error": error})
                continue
            worker.send(self._inline_build(msg.get("request"), left, inline))

    def _inline_build(self, request: Any, left: float, inline: list[dict]) -> dict[str, Any]:
        """One `load_inline` call built (its record added to `inline`): the reply the worker gets."""
        began = time.monotonic()
        cand = self.cand
        try:
            origin = cand.origin.name if cand.kind == "single_file" else "model_new.py"
            built = self.judge.inline.build(request, (origin, cand.text().get("model_new.py", "")),
                                            timeout=min(self.cfg.build_timeout_s, left), hidden=[cand.origin])
        except (InlineError, RuntimeError) as exc:
            inline.append({"error": str(exc), "seconds": round(time.monotonic() - began, 3)})
            return {"error": str(exc)}
        inline.append({"module": built.module, "cached": built.cached, "seconds": round(built.seconds, 3),
                       "log": built.log[-5000:]})
        problems = library_problems(built.path, self.cfg.rules.allowed_ops)
        self.violated(problems, "native code")
        if problems and self.cfg.policy == "strict":  # it is not loaded at all
            return {"error": f"policy violation: {problems[0]}"}
        # a copy of its own: the published libraries stay hidden from candidates (held out: a candidate with no kernel
        # imported another's from the shared folder and was correct at 9x eager)
        # (in its build folder, which the judge writes and the candidate only reads: its own folder is the candidate's
        # to write, where a link made the judge write anywhere; held out, red team 2026-12-05)
        own = self.slot.run_dir / "build" / "extensions" / built.module / built.path.name
        own.parent.mkdir(parents=True, exist_ok=True)
        fresh = own.with_name(f".{own.name}.{secrets.token_hex(4)}")
        shutil.copyfile(built.path, fresh)
        os.replace(fresh, own)  # a new file: the same call made again must not rewrite a library already loaded
        return {"path": str(own), "module": built.module, "sha256": built.sha256}
