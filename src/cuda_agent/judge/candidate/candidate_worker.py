"""Candidate worker: loads the candidate, runs it on the judge's inputs under the op audit, then times it.

It never sees reference outputs. The judge sends one seed per trial (so no later input set is known in advance);
the worker draws that input set with the task's `get_inputs` (at other sizes for the extra-shape trial), runs
`ModelNew` under the op audit while the profiler watches every other thread, copies the outputs into shared
memory for the reference worker to compare (`transfer.py`), and reports fingerprints of the inputs as the candidate
left them. Timing asks the judge for a fresh seed before every call and writes that input set into the timed
buffers; after a call the judge may ask for its outputs, which it then checks.

Around the calls (`Guard`): once `ModelNew` is built no process may be started (a seccomp filter kills the worker),
and no thread of the candidate may still be computing after `forward` returns or while the judge prepares a call.

Usage (by the judge): python -m cuda_agent.judge.candidate.candidate_worker REQUEST.json
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

# Under the strict policy the compute packages are hidden from this process's view (policy.compute_packages); marked
# missing here too, before torch looks for numpy, so that nothing imports what is left of them (`hidden` says why).
BLOCKED = tuple(n for n in os.environ.pop("CUDA_AGENT_BLOCKED_PACKAGES", "").split(",") if n)
for _name in BLOCKED:
    sys.modules[_name] = None  # type: ignore[assignment]

import torch  # noqa: E402

from ...backend import get_backend
from ...sandbox.seccomp import SeccompError, forbid_moved_mappings, forbid_new_processes
from ...task import enable_sizes, import_file
from ...workspace.inline import load_published, request_from_call
from .. import kernelbench
from ..checks.symbols import NativeAudit
from ..wire.call_protocol import RELOADED, RELOADED_WEIGHTS, STATE_DICT_FINDING
from ..wire.process import Channel, Handler, WorkerFailure, one_line, raised_at, run_worker
from ..wire.tensors import checksum, leaves, make_inputs, refill
from ..wire.timing import Hooks, time_callable
from ..wire.transfer import export_outputs
from .audit import Introspection, OpAudit, ThreadAudit
from .callee import Callee
from .integrity import Integrity

SETTLE_S = 0.002  # how long the worker watches the other threads after each call ...
SETTLE_MAX_S = 0.25  # ... and at most, while one of them is still runnable (not yet scheduled on a busy machine)
IDLE_US = 100.0  # CPU time other threads may take in that window (waking pools going back to sleep) ...
IDLE_FRACTION = 0.25  # ... plus this share of the call's own duration


def route_load_inline(chan: Channel, allowed: Callable[[], bool]) -> None:
    """`load_inline` asks the judge to build (workspace/inline.py) and loads the library it published; this process
    never builds into a shared folder. Only while `allowed()`: the module loads or ModelNew is built."""
    from torch.utils import cpp_extension

    signature = inspect.signature(cpp_extension.load_inline)

    def load_inline(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        if not allowed():
            raise RuntimeError("load_inline: build extensions when the module loads or in ModelNew.__init__, "
                               "not in forward")
        chan.send("build", request=request_from_call(dict(bound.arguments)))
        reply = chan.receive()
        if "error" in reply:
            raise RuntimeError(f"load_inline could not build {bound.arguments.get('name')!r}: {reply['error']}")
        return load_published(Path(reply["path"]), reply["module"], reply["sha256"],
                              bound.arguments.get("is_python_module", True))

    cpp_extension.load_inline = load_inline


def output_problems(out: Any, inputs: Any) -> list[str]:
    """Outputs must be plain tensors with their own storage (no proxies, no aliasing of inputs)."""
    problems = []
    input_ptrs = {x.untyped_storage().data_ptr() for _, x in leaves(inputs) if isinstance(x, torch.Tensor)}
    for path, leaf in leaves(out):
        if isinstance(leaf, torch.Tensor):
            if type(leaf) is not torch.Tensor:
                problems.append(f"{path} is a {type(leaf).__name__}, not a plain torch.Tensor")
            elif leaf.untyped_storage().data_ptr() in input_ptrs and leaf.numel() > 0:
                problems.append(f"{path} aliases an input tensor's memory")
        elif not isinstance(leaf, (int, float, bool, type(None))):
            problems.append(f"{path} is a {type(leaf).__name__}, not a tensor or number")
    return problems


def state_dict_mismatch(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> str | None:
    """Why `model` would not take `state` with `load_state_dict(strict=True)` (names or shapes), or None; the
    model's own weights stay as they are."""
    own = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    theirs = {name: tuple(t.shape) for name, t in state.items()}
    missing, unexpected = sorted(set(theirs) - set(own)), sorted(set(own) - set(theirs))
    shapes = sorted(name for name in set(own) & set(theirs) if own[name] != theirs[name])
    parts = [f"{label}: {', '.join(names[:4])}{' ...' if len(names) > 4 else ''}" for label, names in
             (("missing", missing), ("unexpected", unexpected), ("other shapes", shapes)) if names]
    return "; ".join(parts) or None


def stray_processes(sandboxed: bool) -> list[str]:
    """Processes besides this worker: in the sandbox's PID namespace all but its init (PID 1); else our children."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in (1, me):
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if sandboxed or ppid == me:
            found.append(f"{entry} ({stat[stat.index('(') + 1:stat.rindex(')')]})")
    return found


def thread_clock(tid: int) -> int:
    """The CPU-time clock of one thread of this process (Linux's per-thread CPUCLOCK_SCHED id). Unlike /proc's
    counters, which lag a running thread by up to a scheduler tick, it includes the time the thread is running now."""
    clock = ((~tid) << 3 | 6) & 0xFFFFFFFF
    return clock - (1 << 32) if clock >= 1 << 31 else clock


def thread_cpu_us(tids: set[str] | None = None) -> dict[str, float]:
    """On-CPU time of this process's live threads (all, or those in `tids`), in microseconds."""
    found = {}
    for tid in os.listdir("/proc/self/task") if tids is None else tids:
        try:
            found[tid] = time.clock_gettime_ns(thread_clock(int(tid))) / 1e3
        except OSError:  # it has ended
            continue
    return found


def runnable(tids: Iterable[str]) -> list[str]:
    """Those of this process's threads `tids` that are running or waiting for a CPU (state R)."""
    found = []
    for tid in tids:
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:  # it has ended
            continue
        if stat[stat.rindex(")") + 2:].startswith("R"):
            found.append(tid)
    return found


@dataclass
class Mark:
    """The CPU clocks at one moment: the process's, the harness threads' sum read just before and just after it,
    and the live candidate threads' own clocks."""
    process: float
    harness_before: float
    harness_after: float
    others: dict[str, float]


class Guard:
    """Work must happen inside the calls. The harness's threads are those that exist before any candidate code runs
    (the worker starts torch's thread pool, the CUDA context and the profiler first); every thread started later is
    the candidate's, directly or through a pool it started. Their CPU time must stay near zero after a call returns
    and while a call is prepared.

    Their time is the process's clock minus the harness threads' (which counts threads that have ended too), and at
    least what the live candidate threads' own clocks say. The process's clock sums each thread's runtime as last
    accounted, so a harness thread running on another core while the clocks are read (a pool thread spinning after
    the harness's own work) is counted a little later than its own clock says: the harness clocks are read on both
    sides of the process's, and the candidate is charged only what lies outside that window (a measured busy time is
    a lower bound, never the harness's time charged to the candidate)."""

    def __init__(self) -> None:
        # tid -> CPU time when last seen (kept for threads that have ended)
        self.harness = thread_cpu_us()
        self.seen: dict[str, str] = {}  # threads of the candidate seen so far: tid -> name (for the verdict)

    def _harness_sum(self) -> float:
        self.harness.update(thread_cpu_us(set(self.harness)))
        return sum(self.harness.values())

    def mark(self) -> Mark:
        others = {t: us for t, us in thread_cpu_us().items() if t not in self.harness}
        self._remember(others)
        before = self._harness_sum()
        process = time.process_time_ns() / 1e3
        return Mark(process, before, self._harness_sum(), others)

    def busy_us(self, since: Mark) -> tuple[float, dict[str, float]]:
        """The candidate threads' CPU time since the mark (a lower bound), and each live one's."""
        now = self.mark()
        lower = (now.process - now.harness_after) - (since.process - since.harness_before)
        threads = {t: us - since.others.get(t, 0.0) for t, us in now.others.items()}
        return max(lower, sum(threads.values())), threads

    def limit_us(self, call_us: float) -> float:
        return IDLE_US + IDLE_FRACTION * call_us

    def _fail(self, label: str, busy: float, when: str, threads: dict[str, float]) -> WorkerFailure:
        busiest = sorted(((us, t) for t, us in threads.items()), reverse=True)
        named = ", ".join(f"thread {t} ({self.seen.get(t, '?')}) {us:.0f} us" for us, t in busiest[:3])
        if not named:
            ended = sorted(set(self.seen) - set(threads))
            named = "threads that have ended" + (": " + ", ".join(f"{t} ({self.seen[t]})" for t in ended[:5])
                                                 if ended else ", none of them seen alive")
        return WorkerFailure("verify_error", f"{label}: threads of the candidate computed for {busy:.0f} us {when} "
                                             f"({named}): all work must happen inside the call")

    def _remember(self, threads: dict[str, float]) -> None:
        for tid in threads:
            if tid not in self.seen:
                try:
                    self.seen[tid] = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
                except OSError:
                    self.seen[tid] = "?"

    def settle(self, label: str, call_us: float) -> None:
        """After a call returned: its threads must be done (fails the candidate at once if they are not). Watched for
        SETTLE_S, and longer while one of them is runnable: on a busy machine a thread left working may not have
        been scheduled yet, and it must be seen working rather than pass unseen."""
        start = self.mark()
        deadline = time.monotonic() + SETTLE_MAX_S
        while True:
            time.sleep(SETTLE_S)
            busy, threads = self.busy_us(start)
            if busy > self.limit_us(call_us):
                raise self._fail(label, busy, f"after forward returned ({call_us:.0f} us)", threads)
            waiting = runnable(threads)
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise self._fail(label, busy, f"after forward returned ({call_us:.0f} us), still runnable "
                                              f"{SETTLE_MAX_S * 1e3:.0f} ms later", {t: threads[t] for t in waiting})

    def check_quiet(self, since: Mark, label: str, call_us: float,
                    when: str = "while the judge prepared the call") -> None:
        """Nothing of the candidate's ran since the mark (while the judge checked the last call, prepared the next)."""
        busy, threads = self.busy_us(since)
        if busy > self.limit_us(call_us):
            raise self._fail(label, busy, when, threads)


def installed_folders() -> list[str]:
    """Where the interpreter, its packages and the system's libraries live (read-only to the candidate)."""
    import site
    import sysconfig

    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, *site.getsitepackages(), sysconfig.get_paths()["purelib"],
             sysconfig.get_paths()["platlib"], "/usr", "/lib", "/lib64", "/opt", "/etc"}
    return sorted({os.path.realpath(r) for r in roots if r and os.path.isdir(r)})


def import_path(candidate_dirs: list[str], own: list[str]) -> list[str]:
    """The folders this interpreter imports from before any candidate code runs (PYTHONPATH's included, also where
    it lies in /tmp): bound read-only into the candidate's sandbox, so their code is not the candidate's. Neither a
    folder the candidate may write (`candidate_dirs`) nor anything inside its own folders (`own`) is among them."""
    found = {os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)}
    inside = tuple(os.path.realpath(d).rstrip("/") + "/" for d in own)
    return sorted(p for p in found if p not in candidate_dirs and not (p + "/").startswith(inside))


def start_harness_threads(backend) -> None:
    """Whatever threads torch's pool, the CUDA context and the profilers start, they start now (the Guard)."""
    torch.ones(1 << 22).mul_(2)  # enough chunks for torch's whole CPU thread pool
    x = torch.ones(1 << 16, device=backend.device)
    with ThreadAudit(()):
        x.mul_(2)
    backend.warm_up()  # the device's context and its profiler (CUPTI's threads)
    x.sum().item()


def hidden(exc: BaseException) -> str | None:
    """The reason, when an import failed at a package hidden by the strict policy."""
    name = (getattr(exc, "name", None) or "").split(".")[0]
    if isinstance(exc, ImportError) and name in BLOCKED:
        return f"{exc.name} is hidden from candidates under the strict policy (compute must happen in the " \
               "candidate's kernels)"
    return None


class LoadedCandidate:
    def __init__(self, req: dict, chan: Channel):
        self.req, self.chan = req, chan
        self.backend = get_backend(req["backend"])
        self.device = self.backend.device
        self.backend.precision_flags(req["allow_tf32"])
        self.building = True  # load_inline is served until ModelNew is built
        route_load_inline(chan, lambda: self.building)
        # The op audit's first dispatch from C++ imports torch._dynamo (1-3 s): import it now, while the reference
        # worker is still starting, instead of inside the first verified forward.
        importlib.import_module("torch._dynamo")
        start_harness_threads(self.backend)
        self.guard = Guard()  # every thread that exists now is the harness's
        self.integrity = Integrity((sys.modules[__name__],))  # before any candidate code runs
        self.shared: list = []  # the last exported outputs' buffers
        writable = [os.getcwd(), req["build_dir"], tempfile.gettempdir(), "/tmp", "/dev/shm"]
        self.native = NativeAudit(str(Path(torch.__file__).parent / "lib"), installed_folders(),
                                  [os.path.realpath(w) for w in writable]) if req["audit_ops"] else None
        installed = (os.path.realpath(torch.__file__), os.path.realpath(__file__))
        candidate_dirs = [d for d in map(os.path.realpath, writable)
                          if not any(i.startswith(d.rstrip("/") + "/") for i in installed)]  # (a venv in /tmp)
        self.introspection = Introspection(
            candidate_dirs, import_path(candidate_dirs, [os.getcwd(), req["build_dir"]])) if req["audit_ops"] else None
        if self.introspection:
            self.introspection.arm()
        self.unrefused: list[str] = []  # what this kernel would not let the filters refuse
        if self.backend.name == "cpu":  # the trusted CPU sampler's records of code mapped in a call: no moves past it
            try:
                forbid_moved_mappings()
            except SeccompError as exc:
                self.unrefused.append(f"mappings moved during the calls cannot be refused here ({exc})")
        if req["audit_ops"]:
            # strict: no process of the candidate's, even while it loads (answered EPERM; fatal once ModelNew is
            # built). Held out, red team 2026-12-06: g++ run from ModelNew.__init__ built torch's own AOTInductor
            # library of the reference's computation, whose runner dispatches no op but the allocation of its
            # output: correct at torch.compile's speed under strict, reward 2, no violation. Its native code comes
            # through the judge's builds (load_inline included), checked there.
            with contextlib.suppress(SeccompError):  # (`initialise` says so where the kernel refuses filters)
                forbid_new_processes(kill=False)
        try:
            model_cls = getattr(import_file(Path(req["build_dir"]) / "model_new.py", "model_new"), "ModelNew")
        except Exception as exc:
            reason = hidden(exc) or one_line(exc)
            raise WorkerFailure("load_error", f"loading the candidate failed: {reason}") from exc
        self.model_cls = model_cls
        self.allowed_ops = tuple(req["allowed_ops"])
        self.audit = OpAudit(self.allowed_ops) if req["audit_ops"] else None
        # The task module only supplies get_inputs() on the in-process path; on the trusted path the inputs come from
        # the reference worker and this process needs nothing of the task. Model is never built here.
        self.task = None if req.get("trusted_inputs") else import_file(req["task_path"], "task_inputs")
        if self.task is not None:
            enable_sizes(self.task, Path(req["task_path"]).read_text())  # as the reference worker does

    def initialise(self, public: Path) -> tuple[list[str], list[str]]:
        """Build ModelNew with the reference's constructor arguments and weights: its state dict (strict), or under
        the kernelbench policy KernelBench's seeded construction, where a state dict it would not take is a finding
        (what strict would say); then no more processes. Returns warnings and findings."""
        self.public = public
        init_inputs = torch.load(public / "init_inputs.pt", weights_only=True)
        state = torch.load(public / "state_dict.pt", weights_only=True)
        seeded = self.req.get("policy") == "kernelbench"
        try:
            if seeded:
                self.model = kernelbench.construct(self.model_cls, [x.to(self.device) if isinstance(
                    x, torch.Tensor) else x for x in init_inputs], self.device).eval()
            else:
                with torch.device(self.device):
                    self.model = self.model_cls(*init_inputs).to(self.device).eval()
        except Exception as exc:
            raise WorkerFailure("verify_error", f"ModelNew(*get_init_inputs()) failed: {one_line(exc)}"
                                                f"{raised_at(exc)}") from exc
        findings = []
        try:
            if seeded:
                unloaded = state_dict_mismatch(self.model, state)
                findings += [f"{STATE_DICT_FINDING} (strict would fail): {unloaded}"] \
                    if unloaded else []
            else:
                self.model.load_state_dict(state, strict=True)
        except Exception as exc:
            raise WorkerFailure("verify_error",
                                f"{STATE_DICT_FINDING} (strict): {one_line(exc)}") from exc
        self.building = False
        try:
            forbid_new_processes()
        except SeccompError as exc:
            return [*self.unrefused, f"processes started during forward cannot be forbidden here ({exc}); they are "
                    "only looked for"], findings
        finally:
            strays = stray_processes(self.req["sandboxed"])
            if strays:
                raise WorkerFailure("verify_error", "the candidate left processes running after ModelNew was built "
                                                    f"({', '.join(strays[:4])}): all work must happen in forward")
        return list(self.unrefused), findings

    def audited(self, inputs: list, sync: bool = True) -> Any:
        """ModelNew on `inputs` under the op audit (strict), its device work finished (unless `sync` is false: the
        trusted path's GPU calls, whose work is ordered on the GPU instead)."""
        with torch.no_grad():
            if self.audit is None:
                out = self.model(*inputs)
            else:
                with self.audit:
                    out = self.model(*inputs)
        if sync:
            self.backend.synchronize()
        return out

    def forward(self, inputs: list, label: str) -> tuple[Any, float]:
        """One audited call; returns the outputs and its host time in microseconds."""
        t0 = time.perf_counter()
        try:
            out = self.audited(inputs)
        except Exception as exc:
            reason = hidden(exc) or one_line(exc) + raised_at(exc)
            raise WorkerFailure("verify_error", f"ModelNew.forward failed on {label}: {reason}") from exc
        return out, (time.perf_counter() - t0) * 1e6

    def check_integrity(self) -> None:
        replaced = self.integrity.changed()
        if replaced:
            raise WorkerFailure("verify_error", "candidate code replaced functions the judge relies on: "
                                                + ", ".join(replaced[:8]))

    def export(self, out: Any, inputs: list) -> dict:
        """Outputs into shared memory for the reference worker (descriptors sent now, the manifest in the reply), and
        what the judge checks about them (the harness is checked first: nothing it reports may come from replaced
        functions)."""
        self.check_integrity()
        manifest, self.shared = export_outputs(out)  # the buffers stay until the next export
        self.chan.send_fds([b.fd for b in self.shared])
        return {"manifest": manifest, "fds": len(self.shared), "checksums_after": checksum(inputs),
                "problems": output_problems(out, inputs), "violations": self.native_violations()}

    def run_trial(self, k: int, seed: int, shapes: dict[str, int] | None = None, scale: float | None = None) -> dict:
        """Run ModelNew on the input set of `seed` (at other sizes with `shapes`, scaled by `scale`)."""
        label = f"input set {k}"
        with ThreadAudit(self.allowed_ops, enabled=self.audit is not None) as threads:
            inputs = make_inputs(self.task, seed, self.device, shapes, scale)
            try:
                out, call_us = self.forward(inputs, label)
            except WorkerFailure as failure:  # the worker stays: where the reference fails too, the set is skipped
                return {"failed": str(failure)}
            self.guard.settle(label, call_us)
            reply = self.export(out, inputs)
        violations = (self.audit.messages() if self.audit else []) + threads.messages() + reply["violations"]
        warnings = [] if threads.available else \
            ["this torch cannot profile other threads: background-thread compute was not audited"]
        return {**reply, "violations": violations, "warnings": warnings}

    def serve(self, sock: socket.socket) -> dict:
        """The trusted path: the reference worker drives every call (`callee.py`); inputs come from it, outputs are
        read by it. Timed and verified calls are one and the same kind of call, all under the same audits."""
        audited = self.audit is not None
        def call(inputs: list, fn: str) -> Any:
            if fn == RELOADED:  # (kernelbench policy) strict's state dict, drawn afresh: the last call
                self.model.load_state_dict(torch.load(self.public / RELOADED_WEIGHTS, weights_only=True))
            return self.audited(inputs, sync=callee.order is None)

        callee = Callee(sock, call, pool_library=self.req.get("output_pool"))
        with ThreadAudit(self.allowed_ops, enabled=audited, harness_too=True) as threads:
            calls, canary = callee.serve()
            threads.challenge(canary)
        replaced = self.integrity.changed()
        violations = (self.audit.messages() if self.audit else []) + threads.messages() + self.native_violations() + \
            ([f"candidate code replaced functions the judge relies on: {', '.join(replaced[:8])}"] if replaced else [])
        callee.ended(calls, violations)
        return {"calls": calls}

    def native_violations(self) -> list[str]:
        """What the audits that watch the whole process saw: libraries loaded or looked into, introspection."""
        return ([f"native code: {p}" for p in self.native.violations()] if self.native else []) + \
            (self.introspection.messages() if self.introspection else [])

    def time(self) -> dict:
        """Timed calls; where the timeline does not show whose kernels ran (cpu), under the same audits as the
        trials, so that no call can tell a timed one from a verified one and compute differently."""
        audited = self.audit is not None and not self.backend.kernel_timeline
        hooks = TimedCalls(self, self.audit if audited else None)
        with torch.no_grad(), ThreadAudit(self.allowed_ops, enabled=audited) as threads:
            stats = time_callable(hooks.call, self.backend, **self.req["timing"], hooks=hooks)
        hooks.finish()
        violations = (self.audit.messages() if audited else []) + threads.messages() + self.native_violations()
        return {**stats, "violations": violations}


    def audit_call(self) -> list[str]:
        """(kernelbench policy, which runs no op audit in the verified and timed calls: torch ops are allowed) One
        call of ModelNew on KernelBench's inputs (seed 42) under strict's op audits, this thread's and every
        other's: what strict would find. Whatever it reports, the candidate's code could have changed (a finding
        only, never a verdict); a call that fails reports nothing (the verified calls say why)."""
        task = self.task or import_file(self.req["task_path"], "task_inputs")
        ops = OpAudit(self.allowed_ops)
        try:
            inputs = kernelbench.inputs(task.get_inputs, kernelbench.SEED, self.device)
            with torch.no_grad(), ThreadAudit(self.allowed_ops) as threads:
                with ops:
                    self.model(*inputs)
                self.backend.synchronize()
        except Exception:
            return []
        return ops.messages() + threads.messages()

    def kernelbench_time(self, method: str) -> dict:
        """KernelBench's timing of ModelNew on its inputs (seed 42), as it does it, in this process: whatever this
        reports, the candidate's code could have changed (kernelbench_timing.py)."""
        task = self.task or import_file(self.req["task_path"], "task_inputs")
        try:
            inputs = kernelbench.inputs(task.get_inputs, kernelbench.SEED, self.device)
            with torch.no_grad():
                return {"ms": kernelbench.time_calls(self.model, inputs, kernelbench.TIMINGS[method], self.device)}
        except Exception as exc:
            return {"error": f"{one_line(exc)}{raised_at(exc)}"}


class TimedCalls(Hooks):
    """The timing loop's calls: each one on a fresh input set from a seed the judge sends just before it (written
    into the same buffers); before the next, the judge may ask for the outputs of the one that just ran."""

    def __init__(self, cand: LoadedCandidate, audit: OpAudit | None):
        self.cand, self.chan, self.audit = cand, cand.chan, audit
        self.warmup = max(1, int(cand.req["timing"]["warmup"]))
        self.inputs: list | None = None
        self.outputs: Any = None
        self.done = -1  # the last call that ran
        self.planned = 0
        self.mark: Mark | None = None
        self.call_us = 0.0

    def call(self) -> None:
        if self.audit is None:
            self.outputs = self.cand.model(*self.inputs)
        else:
            with self.audit:
                self.outputs = self.cand.model(*self.inputs)

    def _handshake(self, call: int | None) -> int | None:
        """Tell the judge which call comes next (None: no more); export the previous call's outputs if it asks;
        return the seed of the next input set."""
        self.chan.send("call", call=call, timed=call is not None and call >= self.warmup, planned=self.planned)
        while True:
            reply = self.chan.receive()
            if not reply.get("export"):
                return reply.get("seed")
            self.chan.send("exported", call=self.done, **self.cand.export(self.outputs, self.inputs))

    def plan(self, iters: int) -> None:
        self.planned = iters

    def before(self, call: int) -> None:
        seed = self._handshake(call)
        fresh = make_inputs(self.cand.task, int(seed), self.cand.device)
        self.inputs = fresh if self.inputs is None else refill(self.inputs, fresh)
        self.cand.backend.synchronize()
        if self.mark is None or call == self.warmup:  # else watched since the last call's watch ended (`after`)
            self.mark = self.cand.guard.mark()  # (the timed calls' profiler has just started: its own threads)

    def ready(self, call: int) -> None:
        self.cand.guard.check_quiet(self.mark, f"timed call {call}", self.call_us)

    def after(self, call: int, host_us: float) -> None:
        self.done, self.call_us = call, host_us
        self.cand.guard.settle(f"timed call {call}", host_us)
        self.mark = self.cand.guard.mark()  # the handshake, an export and the next inputs are watched too

    def finish(self) -> None:
        self._handshake(None)  # the last call's outputs may be exported here
        self.cand.guard.check_quiet(self.mark, f"timed call {self.done}", self.call_us,
                                    "after it returned, while the judge checked it")


def start(req: dict, chan: Channel) -> dict:
    cand = LoadedCandidate(req, chan)

    def checked(handler: Handler) -> Handler:
        def run(cmd: dict) -> tuple[str, dict]:
            reply = handler(cmd)
            cand.check_integrity()
            return reply
        return run

    checked(lambda cmd: ("", {}))({})  # loading the candidate ran its module code
    chan.send("loaded", violations=cand.native_violations())

    def initialise(cmd: dict) -> tuple[str, dict]:
        warnings, findings = cand.initialise(Path(cmd["public_dir"]))
        return "initialised", {"warnings": warnings, "findings": findings, "violations": cand.native_violations()}

    def serve(cmd: dict) -> tuple[str, dict]:
        return "served", cand.serve(socket.socket(fileno=chan.receive_fds(1)[0]))

    return {
        "serve": serve,
        "init": checked(initialise),
        "trial": checked(lambda cmd: ("trial_done", cand.run_trial(int(cmd["k"]), int(cmd["seed"]),
                                                                   cmd.get("shapes"), cmd.get("scale")))),
        "time": checked(lambda cmd: ("timed", {"stats": cand.time(), "memory_peak": cand.backend.memory_peak()})),
        "audit": checked(lambda cmd: ("audited", {"findings": cand.audit_call()})),
        "kernelbench_time": lambda cmd: ("kernelbench_timed", cand.kernelbench_time(cmd["method"])),
    }


def prepare(req: dict) -> None:
    """A spare's warm-up, before any candidate is known: what every evaluation needs first (torch._dynamo for
    the op audit, the device's context)."""
    importlib.import_module("torch._dynamo")
    get_backend(req["backend"]).warm_up()


if __name__ == "__main__":
    run_worker(start, "verify_error", prepare)
