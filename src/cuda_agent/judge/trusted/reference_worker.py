"""Reference worker: the trusted side. It runs only the task's code and never imports candidate code.

It builds `Model` once and stays warm across evaluations of its task (judge/references.py). Commands: `begin`
starts an evaluation: fresh weights from the evaluation's seed, written with the constructor arguments where the
candidate worker can read them; `trial` draws one input set from a seed and computes the reference outputs in fp32
(the tolerance check) and fp64 (fp32 eager's own error); `compare` checks the candidate's outputs for that trial
on the device; `time` measures eager and torch.compile (compiled once per worker), `time_eager` a short eager
timing. Reference outputs never leave this process.

Usage (by the judge): python -m cuda_agent.judge.trusted.reference_worker REQUEST.json
"""

from __future__ import annotations

import copy
import math
import random
import secrets
import socket
import statistics
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator

import torch

from ...backend import get_backend
from ...task import enable_sizes, import_file
from .. import kernelbench
from ..scoring.speed_of_light import count_work
from ..wire.call_protocol import RELOADED, RELOADED_WEIGHTS
from ..wire.process import Channel, WorkerFailure, close_fds, one_line, run_worker
from ..wire.tensors import checksum, clone, leaves, make_inputs, refill, tensor_bytes, to_double
from ..wire.timing import Hooks, draw_checks, summarize, time_callable
from ..wire.trusted_commands import (
    Attach,
    Attached,
    CandidateChecked,
    Check,
    Detach,
    Detached,
    FitSizes,
    Sizes,
    TimeCandidate,
    decode,
)
from . import baseline_callee
from .compare import compare_leaves, compare_trial, unfit
from .gpu_calls import RESOLUTION_US, GpuCalls, quantiles
from .readback import Unreadable, layout, overlaps_itself
from .trusted_calls import CallFailed, Calls

# what is read of a call's outputs: 4x the reference's own + 1 MiB (dtypes and shapes must match; a view into a
# padded or larger buffer spans more than it holds)
OUTPUT_FACTOR, OUTPUT_SLACK = 4, 1 << 20


def _step(what: str, fn, *args):
    try:
        return fn(*args)
    except Exception as exc:  # the task itself is broken: report one clear line
        raise WorkerFailure("task_error", f"{what} failed: {one_line(exc)}") from exc


# an evaluation's device memory over its weights and inputs: the reference's copies (inputs cloned, outputs, fp64
# weights, activations and outputs) and the candidate's own (measured on the H100, pointwise and row chains of 0.3-1
# GB inputs: reference workers held 6-16 times their input; a guess of 4 ran the device out of memory)
GUESS = 16
BASELINE_TIMEOUT_S = 900.0  # the baseline callee's compilation or timing at most
BASELINE_READ_LIMIT = 0  # its outputs are never read
SCALE_MAX = 4.0  # calls on the trusted path draw their inputs' scale from [1, SCALE_MAX], log-uniformly
EMPTY_CALLS = 10  # the GPU clock's empty calls just before the timed calls, and again just after


class Reference:
    def __init__(self, req: dict):
        self.req = req
        self.backend = get_backend(req["backend"])
        self.device = self.backend.device
        self.precision = self.backend.precision_flags(req["allow_tf32"])
        self.backend.warm_up()  # the profiler's first start, not in the first timed run (under the device lock)
        self.module = _step("importing the reference", import_file, req["task_path"], "reference_task")
        enable_sizes(self.module, Path(req["task_path"]).read_text())  # the extra shape may change its literals
        for name in ("Model", "get_inputs", "get_init_inputs"):
            if not hasattr(self.module, name):
                raise WorkerFailure("task_error", f"the reference defines no {name}")
        torch.manual_seed(req["init_seed"])
        self.init_inputs = list(_step("get_init_inputs()", self.module.get_init_inputs))
        with torch.device(self.device):
            self.model = _step("building Model(*get_init_inputs())",
                               lambda: self.module.Model(*self.init_inputs).to(self.device).eval())
        self.model64 = None
        self.compiled = None
        self.overlapping: set[str] = set()  # paths of the reference's outputs whose layout overlaps itself
        self.trial: dict = {}
        self.work: dict | None = None  # counted at the first `begin`, when the judge lets it use the device
        self.scales: bool | None = None  # whether scaled inputs hold for the task (`scale_holds`)
        self.baseline: Calls | None = None  # the baseline callee's calls (trusted path)
        self.baseline_process = None

    def memory_guess(self) -> int:
        """Device memory an evaluation of this task may hold, guessed before it runs (for scheduling only): GUESS
        times its weights and one input set, the inputs drawn on the meta device (nothing allocated); 0 where they
        cannot be drawn there."""
        try:
            inputs = tensor_bytes(make_inputs(self.module, 0, "meta"))
        except Exception:
            return 0
        return GUESS * (tensor_bytes(list(self.model.state_dict().values())) + inputs)

    def count_work(self) -> dict:
        """Run Model once (a reference that cannot run fails here, before any candidate is) and count its work."""
        if self.work is None:
            probe = _step("get_inputs()", make_inputs, self.module, self.req["init_seed"], self.device)
            with torch.no_grad():
                _, self.work = _step("Model.forward", count_work, lambda inputs: self.model(*inputs), probe)
            del probe
            self._release()
        return self.work

    def begin(self, init_seed: int, public: Path) -> None:
        """A new evaluation: weights drawn afresh (into the same module, so torch.compile stays warm), published;
        under the kernelbench policy, KernelBench's (`kernelbench.construct`: the same every evaluation)."""
        self.init_seed, self.public = init_seed, public
        if self.req.get("policy") == "kernelbench":
            self.init_inputs = [x.cpu() if isinstance(x, torch.Tensor) else x for x in _step(
                "get_init_inputs()", kernelbench.init_inputs, self.module.get_init_inputs, "cpu")]
            fresh = _step("building Model(*get_init_inputs())", kernelbench.construct, self.module.Model,
                          [x.to(self.device) if isinstance(x, torch.Tensor) else x for x in self.init_inputs],
                          self.device)
            self._load(fresh, public / "state_dict.pt")
        else:
            self.reload(public / "state_dict.pt")
        torch.save(self.init_inputs, public / "init_inputs.pt")

    def reload(self, path: Path) -> None:
        """Weights drawn afresh from the evaluation's seed into Model, published at `path` (also, under the
        kernelbench policy, the last of its strict extras: ModelNew loads them, as strict has it do)."""
        torch.manual_seed(self.init_seed)
        with torch.device(self.device):
            fresh = _step("building Model(*get_init_inputs())", lambda: self.module.Model(*self.init_inputs))
        self._load(fresh, path)

    def _load(self, fresh: torch.nn.Module, path: Path) -> None:
        self.model.load_state_dict(fresh.state_dict())
        self.model64 = None  # the fp64 copy follows the new weights
        torch.save({k: v.detach().cpu() for k, v in self.model.state_dict().items()}, path)

    def run_trial(self, seed: int, shapes: dict[str, int] | None = None, scale: float | None = None,
                  fp64: bool = True) -> dict:
        """Draw one input set and compute its reference outputs (and, with `fp64`, fp64 ones for fp32 eager's own
        error). With `shapes` or `scale` (the extra checks) a failure or a non-finite output means the task does not
        hold there: it is reported, not raised."""
        if shapes or scale is not None:
            try:
                with torch.no_grad():
                    drawn = make_inputs(self.module, seed, self.device, shapes, scale)
                    problem = unfit(self.model(*clone(drawn)), lambda: self._fp64(drawn))
            except Exception as exc:
                return {"checksums": None, "error": one_line(exc)}
            if problem:
                return {"checksums": None, "error": f"its outputs are {problem} there"}
        inputs = _step("get_inputs()", make_inputs, self.module, seed, self.device, shapes, scale)
        sums = checksum(inputs)
        with torch.no_grad():
            out = _step("Model.forward", lambda: self.model(*clone(inputs)))
            out64 = self._fp64(inputs) if fp64 else None
        self.backend.synchronize()
        self.trial = {"outputs": out, "outputs64": out64}
        return {"checksums": sums}

    def fit_sizes(self, shapes: dict[str, int]) -> dict:
        """The extra shape's sizes at which the task itself still runs (finite outputs): all of `shapes` where it
        does, else those kept one by one in order; `reason` says why none could change."""
        kept: dict[str, int] = {}
        reason = ""
        for trial in ([shapes] if len(shapes) > 1 else []) + [{name: value} for name, value in shapes.items()]:
            candidate = {**kept, **trial}
            probe = self.run_trial(secrets.randbelow(2**31), candidate, None, fp64=False)
            self.trial = {}
            if probe["checksums"] is not None:
                kept = candidate
                if trial is shapes:
                    break
            else:
                reason = reason or probe["error"]
        self._release()
        return {"shapes": kept, "reason": reason}

    def scale_holds(self) -> bool:
        """Whether the task holds at up to SCALE_MAX times its inputs (finite reference outputs): then every call's
        inputs are scaled by a factor drawn for it, so that no check is told apart by its values."""
        if self.scales is None:
            probe = self.run_trial(secrets.randbelow(2**31), scale=SCALE_MAX, fp64=False)
            self.scales = probe["checksums"] is not None
            self.trial = {}
        return self.scales

    def draw_scale(self, rng: random.Random) -> float | None:
        """A call's factor (None: the task's own values, where scaling is off or does not hold)."""
        if not self.req.get("scaled_inputs") or not self.scale_holds():
            return None
        return math.exp(rng.uniform(0.0, math.log(SCALE_MAX)))

    def reference_outputs(self, inputs: list, fp64: bool) -> tuple[Any, Any]:
        with torch.no_grad():
            out = _step("Model.forward", lambda: self.model(*clone(inputs)))
            out64 = self._fp64(inputs) if fp64 else None
        self.overlapping |= {path for path, x in leaves(out) if isinstance(x, torch.Tensor)
                             and overlaps_itself(list(x.shape), list(x.stride()))}
        return out, out64

    def check_call(self, calls: Calls, inputs: list, label: str, deadline: float, fp64: bool,
                   out: Any = None, out64: Any = None, kernelbench_rule: bool = False, fn: str = "") -> dict:
        """One call of the candidate (`fn`: call_protocol.Call's) on `inputs`, its outputs read and compared here
        (`call_us`: its window)."""
        if out is None:
            out, out64 = self.reference_outputs(inputs, fp64)
        calls.load(inputs)
        try:
            call = calls.call(deadline, fn)
        except CallFailed as exc:
            raise CallFailed(f"{label}: {exc}", exc.how) from None
        return {**self._judge_call(calls, call, out, out64, label, kernelbench_rule), "call_us": call.window_us}

    def _judge_call(self, calls: Calls, call, out: Any, out64: Any, label: str, kernelbench_rule: bool = False) -> dict:
        """The call's inputs and outputs checked. With `kernelbench_rule` KernelBench's rule decides, and what this
        judge's own checks found (an input changed in place, outputs outside its rule) are `findings`."""
        mutated = self._promise_broken(calls, call, label)
        if mutated and not kernelbench_rule:
            return {"ok": False, "reason": mutated}
        try:
            got, shape = calls.outputs(call, OUTPUT_FACTOR * tensor_bytes(out) + OUTPUT_SLACK)
        except Unreadable as exc:
            return {"ok": False, "reason": f"invalid output: {label}: {exc}"}
        result = compare_leaves(got, shape, out, out64, self.req["atol"], self.req["rtol"], label,
                                self.req["max_relative_error"], kernelbench_rule)
        if not result["ok"]:
            result["reason"] = f"incorrect: {result['reason']}"
        strict = result.pop("strict")
        if kernelbench_rule:
            result["findings"] = ([mutated] if mutated else []) + ([f"incorrect: {strict}"] if strict else [])
        return result

    def check_candidate(self, calls: Calls, seed: int, shapes: dict[str, int] | None,
                        scale: float | None, label: str, deadline: float, reload: bool = False) -> dict:
        """A verification call: the reference on this input set (where extra shapes or scales do not hold for the
        task itself there is nothing to check: `skipped`), then the candidate's call, compared. Under the
        kernelbench policy its own input sets (no extra shape, no scale) are KernelBench's trials: inputs made as
        it makes them, its rule deciding; with `reload` (its strict extra, the last call) both sides compute with
        weights drawn afresh."""
        if reload:
            self.reload(self.public / RELOADED_WEIGHTS)
            inputs = _step("get_inputs()", make_inputs, self.module, seed, self.device)
            return self.check_call(calls, inputs, label, deadline, fp64=True, fn=RELOADED)
        if shapes or scale is not None:
            probe = self.run_trial(seed, shapes, scale, fp64=False)
            self.trial = {}
            if probe["checksums"] is None:
                return {"skipped": probe["error"]}
            inputs = _step("get_inputs()", make_inputs, self.module, seed, self.device, shapes, scale)
            return self.check_call(calls, inputs, label, deadline, fp64=True)
        trial = self.req.get("policy") == "kernelbench"
        inputs = _step("get_inputs()", kernelbench.inputs, self.module.get_inputs, seed, self.device) if trial else \
            _step("get_inputs()", make_inputs, self.module, seed, self.device)
        return self.check_call(calls, inputs, label, deadline, fp64=True, kernelbench_rule=trial)

    def time_calls(self, calls: Calls, timing: dict, deadline: float, fn: str = "", check_bits: int = 0,
                   inputs_checked: bool = False) -> dict:
        """Timed calls of a callee (the candidate; the baseline callee's `fn`), each on fresh inputs (a seed and a
        scale drawn here), the cache flushed before each; warm-up calls first, then as many timed calls as `timing`
        asks. The outputs of timed calls drawn here one by one (`draw_checks`, `check_bits`) are read and compared as
        each returns; with
        `inputs_checked` every call's inputs are compared with what was written. The stats are the trusted windows
        (`cpu_us`: the kernel's CPU time)."""
        rng = random.Random(secrets.randbits(64))
        lenient = not fn and self.req.get("policy") == "kernelbench"  # the candidate's, under KernelBench's rules
        findings: list[str] = []
        flush = self.backend.make_cache_flusher()
        forced: list[str] = []  # calls checked because their window may have been cut (`Calls.must_check`)
        errors64: dict[str, list[float]] = {"rel64": [], "eager_rel64": []}  # the checked calls' errors vs fp64
        clock = self.baseline_calls() if isinstance(calls, GpuCalls) else None  # its empty calls: the GPU clock's
        empty: list[float] = []  # constant part, measured just before and after the timed calls (it drifts)

        def empty_calls() -> None:
            # in a block, the first left out: a window that follows another process's call holds one more
            # context switch (~7 us on the H200), so empty calls between timed ones would charge the callee it
            empty.extend([clock.empty_window(deadline) for _ in range(EMPTY_CALLS + 1)][1:])

        def one(label: str, picked: bool):
            inputs = make_inputs(self.module, rng.randrange(2**31), self.device, None, self.draw_scale(rng))
            calls.load(inputs)
            call = calls.call(deadline, fn, flush)
            if not picked and calls.must_check(call):
                picked = True
                forced.append(label)
            expected = self.reference_outputs(inputs, fp64=not fn) if picked else None  # (fp64: the precision)
            # (the fp64 outputs a tensor: `or` asked a tensor for its truth and the reference worker died of it on
            # every task whose one output holds an infinity; red team 2026-12-06)
            if expected is not None and unfit(expected[0], lambda: expected[1] if expected[1] is not None
                                              else self._fp64(inputs)):
                expected = None  # the task does not hold at this scale: nothing to compare
            result = self._judge_call(calls, call, *expected, label) if expected is not None else \
                self._promises_kept(calls, call, label) if inputs_checked else {"ok": True}
            for key, found in errors64.items():
                found += result.get(key, [])
            # what strict would say (KernelBench checks no timed call); a call whose window may have been cut must
            # be correct under any policy: its time is believed only then
            if not result["ok"] and lenient and result["reason"].startswith("incorrect") and label not in forced:
                findings.append(result["reason"])
            elif not result["ok"]:
                raise CallFailed(result["reason"])
            return call

        warm = [one(f"warm-up call {i}", False).window_us for i in range(max(1, int(timing["warmup"])))]
        per_call = statistics.median(warm[-3:]) / 1e6
        iters = int(min(timing["max_iters"], max(timing["min_iters"],
                                                  math.ceil(timing["target_time_s"] / max(per_call, 1e-6)))))
        picked = draw_checks(rng, 0, iters, check_bits)
        if clock is not None:
            empty_calls()
        timed = [one(f"timed call {i} (fresh values in the timed buffers)", i in picked) for i in range(iters)]
        if clock is not None:
            empty_calls()
        windows, cpu = [call.window_us for call in timed], [call.cpu_us for call in timed]
        self._release()
        gpu = {}
        if clock is not None:
            overhead, shared = clock.overhead_of(empty)
            windows = [GpuCalls.cost_us(call.raw_us, overhead) for call in timed]
            _, low, high = quantiles(empty)
            gpu = {"clock_overhead_us": overhead, "clock_overhead_p20_p80_us": [low, high], "gpu_shared": shared,
                   "clock_resolution_us": RESOLUTION_US,
                   "host_us_median": statistics.median(call.host_us for call in timed)}
        return {**summarize(windows, windows), "cpu_us_median": statistics.median(cpu),
                "cpu_outside_calls_us": calls.outside_ns / 1e3,
                "cpu_booked_late_us": calls.late_ns / 1e3, "memory_peak": calls.memory_peak(),
                **({"cpu_samples": calls.sampled()} if calls.sampled() else {}),
                "checked_calls": sorted(picked), "calls_checked_for_their_length": len(forced), **gpu, **errors64,
                "wrong_timed_calls": len(findings),
                **({"findings": findings[:1] + ([f"and {len(findings) - 1} more timed calls"] if findings[1:] else [])}
                   if lenient else {})}

    def _promises_kept(self, calls: Calls, call, label: str) -> dict:
        broken = self._promise_broken(calls, call, label)
        return {"ok": False, "reason": broken} if broken else {"ok": True}

    def _promise_broken(self, calls: Calls, call, label: str) -> str | None:
        """What every call must keep, read or not: its inputs as they were, the outputs it returned before as they
        were, and outputs laid out as real tensors (no element at two places: the judge's copy would write it)."""
        changed = calls.changed_inputs()
        if changed:
            return f"incorrect: {label}: input {changed[0]} was modified in place by ModelNew.forward"
        if call.rewritten:
            return (f"incorrect: {label}: output {call.rewritten}, which its caller still holds, changed during this "
                    "call (ModelNew wrote again into memory it had returned: a caller that keeps an output sees it "
                    "change)")
        for leaf in call.outputs if isinstance(call.outputs, list) else [None]:
            if not isinstance(leaf, dict):
                return f"invalid output: {label}: malformed output description"
            shape, strides, _ = layout(leaf) or ([], [], 0)  # (a malformed one fails where it is read)
            if (leaf.get("kind") == "tensor" and str(leaf.get("path")) not in self.overlapping
                    and overlaps_itself(shape, strides)):
                return (f"incorrect: {label}: output {leaf.get('path')} overlaps itself (strides {strides[:8]} for "
                        f"shape {shape[:8]}) where the reference's does not: its elements would be written by the "
                        "judge's copy, not by the candidate")
        if call.aliased:
            return (f"incorrect: {label}: its outputs map one page of memory at two addresses ({call.aliased}): "
                    "their elements would be written by the judge's copy, not by the candidate")
        return None

    def _fp64(self, inputs: list):
        try:
            if self.model64 is None:
                self.model64 = copy.deepcopy(self.model).double()
            return self.model64(*to_double(inputs))
        except Exception:  # some ops have no fp64 kernel: fp32 eager's own error is then unknown
            self.model64 = None
            return None

    def compare(self, manifest: Any, fds: list[int], label: str) -> dict:
        """The candidate's outputs (its manifest, the descriptors of their shared memory) against this trial's."""
        result = compare_trial(manifest, fds, self.trial["outputs"], self.trial["outputs64"], self.req["atol"],
                               self.req["rtol"], self.device, label, self.req["max_relative_error"])
        self.trial = {}
        self._release()
        return result

    def _release(self) -> None:
        """Cached device memory back to the device: the candidate and other evaluations' workers need it."""
        if self.device == "cuda":
            torch.cuda.empty_cache()

    def _timed(self, fn_of_inputs, timing: dict) -> dict:
        hooks = FreshInputs(self.module, self.device, self.backend)
        with torch.no_grad():
            return time_callable(lambda: fn_of_inputs(hooks.inputs), self.backend, **timing, hooks=hooks)

    def baseline_calls(self) -> Calls:
        """The baseline callee (`baseline_callee.py`), started on first use and kept with this worker (on the GPU,
        its empty calls calibrate the clock's overhead first, and again while they showed another context's work)."""
        if self.baseline is None:
            self.baseline, self.baseline_process = baseline_callee.start(
                {key: self.req.get(key)
                 for key in ("task_path", "backend", "allow_tf32", "compile_mode", "output_pool")}
                | {"seed": self.req["init_seed"]}, BASELINE_READ_LIMIT, self.calls_class())
            if self.req.get("policy") == "strict" and not isinstance(self.baseline, GpuCalls):
                self.baseline.sample(None, self.req["sample_period_ns"])  # (its calls pay what the candidate's
                # sampled calls pay: cpu_sampler.py)
        if isinstance(self.baseline, GpuCalls) and (self.baseline.overhead_us is None
                                                    or self.baseline.calibration_problem):
            self.baseline.calibrate(make_inputs(self.module, secrets.randbelow(2**31), self.device),
                                    time.monotonic() + BASELINE_TIMEOUT_S)
        return self.baseline

    def calls_class(self) -> type[Calls]:
        """How calls are made: ordered on the GPU, or with the callee stopped and resumed on the CPU."""
        return GpuCalls if self.device == "cuda" else Calls

    def _baseline_timing(self, fn: str, timing: dict) -> dict:
        """`fn` of the baseline callee, through the same calls and clock as the candidate (trusted path)."""
        try:
            return self.time_calls(self.baseline_calls(), timing, time.monotonic() + BASELINE_TIMEOUT_S, fn)
        except CallFailed as exc:
            raise WorkerFailure("task_error", f"the baseline callee failed timing {fn}: {exc}") from None

    def _prepare_compiled(self) -> str | None:
        calls = self.baseline_calls()
        calls.load(make_inputs(self.module, secrets.randbelow(2**31), self.device))
        try:
            return calls.prepare("compile", BASELINE_TIMEOUT_S)
        except CallFailed as exc:
            raise WorkerFailure("task_error", f"the baseline callee failed compiling: {exc}") from None

    def time_baselines(self) -> dict:
        """Eager and torch.compile, timed by the same loop as the candidate (fresh inputs before every call); on the
        trusted path in the baseline callee, through the very calls and clock the candidate's go through."""
        timing = self.req["timing"]
        if self.req.get("trusted_clock"):
            error = self._prepare_compiled()
            return {"eager": self._baseline_timing("eager", timing), "compile_error": error,
                    "compile": None if error else self._baseline_timing("compile", timing)}
        eager = self._timed(lambda inputs: self.model(*inputs), timing)
        compiled_stats, compile_error = None, None
        try:
            compiled = self._compiled()
            compiled_stats = self._timed(lambda inputs: compiled(*inputs), timing)
        except Exception as exc:
            compile_error = one_line(exc)
        self._release()
        return {"eager": eager, "compile": compiled_stats, "compile_error": compile_error}

    def _compiled(self):
        if self.compiled is None:
            mode = self.req["compile_mode"]
            self.compiled = torch.compile(self.model, mode=None if mode == "default" else mode)
        return self.compiled

    def prepare_baselines(self, gate: "DeviceGate | None") -> dict:
        """torch.compile's compilation, done before the device is this evaluation's (it takes CPU seconds, not device
        time); one call runs. With a `gate`, the judge's shared hold on the device is handed back while dynamo and
        inductor compile. A failure is left for `time_baselines` to report."""
        if self.req.get("trusted_clock"):
            self._prepare_compiled()
            return {"unlocked_s": 0.0}
        try:
            with torch.no_grad(), (gate.compiling() if gate else nullcontext()):
                self._compiled()(*make_inputs(self.module, secrets.randbelow(2**31), self.device))
                self.backend.synchronize()
        except Exception:
            pass
        self._release()
        return {"unlocked_s": gate.unlocked_s if gate else 0.0}

    def time_eager(self, timing: dict) -> dict:
        """A short eager timing beside the candidate's: is the machine as it was when the baselines were taken?"""
        if self.req.get("trusted_clock"):
            return self._baseline_timing("eager", timing)
        stats = self._timed(lambda inputs: self.model(*inputs), timing)
        self._release()
        return stats

    def kernelbench_time(self, method: str) -> dict:
        """KernelBench's timing of Model on its inputs (seed 42): eager, and under a torch.compile of its own
        (inductor, default mode: KernelBench's baseline; compiled during its warm-up calls, as there)."""
        timing = kernelbench.TIMINGS[method]
        inputs = _step("get_inputs()", kernelbench.inputs, self.module.get_inputs, kernelbench.SEED, self.device)
        with torch.no_grad():
            eager = _step("Model.forward", kernelbench.time_calls, self.model, inputs, timing, self.device, True)
            try:
                compiled = kernelbench.time_calls(torch.compile(self.model, backend="inductor"), inputs, timing,
                                                  self.device, True)
                error = None
            except Exception as exc:
                compiled, error = None, one_line(exc)
        self._release()
        return {"eager": eager, "compile": compiled, "compile_error": error}


class DeviceGate:
    """The judge's shared hold on the device during torch.compile's first run, seen from this worker. It holds the
    device when the run starts; around dynamo's compilation of a frame (tracing, AOT autograd, inductor, Triton:
    CPU work on fake tensors) it hands the device back (`device_free`) and asks for it again (`device_wanted`,
    answered once no timed run holds the device); inductor's own benchmarks inside a compilation (pad_mm's) ask
    for it too. Everything else of the run (its kernels, eager code between graphs, the autotuning of its first
    launches) runs while the device is held. A torch without these functions keeps the device held throughout."""

    def __init__(self, chan: Channel):
        self.chan = chan
        self.held = True
        self.unlocked_s = 0.0
        self._since = 0.0

    @contextmanager
    def compiling(self) -> Iterator[None]:
        try:
            from torch._dynamo import convert_frame
            from torch._inductor.runtime.benchmarking import benchmarker
            compile_frame, benchmark = convert_frame._compile, benchmarker.benchmark_gpu
        except (ImportError, AttributeError):
            yield
            return
        own = "benchmark_gpu" in vars(benchmarker)

        def _compile(*args, **kwargs):
            with self._free():
                return compile_frame(*args, **kwargs)

        def benchmark_gpu(*args, **kwargs):
            with self._need():
                return benchmark(*args, **kwargs)

        convert_frame._compile, benchmarker.benchmark_gpu = _compile, benchmark_gpu
        try:
            yield
        finally:
            convert_frame._compile = compile_frame
            if own:
                benchmarker.benchmark_gpu = benchmark
            else:
                del benchmarker.benchmark_gpu

    @contextmanager
    def _free(self) -> Iterator[None]:
        if not self.held:
            yield
            return
        self.chan.send("device_free")
        self.held, self._since = False, time.perf_counter()
        try:
            yield
        finally:
            self._take()

    @contextmanager
    def _need(self) -> Iterator[None]:
        if self.held:
            yield
            return
        self._take()
        try:
            yield
        finally:
            self.chan.send("device_free")
            self.held, self._since = False, time.perf_counter()

    def _take(self) -> None:
        self.unlocked_s += time.perf_counter() - self._since
        self.chan.send("device_wanted")
        if not self.chan.receive().get("device"):
            raise WorkerFailure("task_error", "the judge did not hand the device back")
        self.held = True


class FreshInputs(Hooks):
    """Baseline calls get fresh input values before every call too (drawn here from private seeds)."""

    def __init__(self, module, device: str, backend):
        self.module, self.device, self.backend = module, device, backend
        self.seeds = random.Random(secrets.randbits(64))
        self.inputs: list | None = None

    def before(self, call: int) -> None:
        fresh = make_inputs(self.module, self.seeds.randrange(2**31), self.device)
        self.inputs = fresh if self.inputs is None else refill(self.inputs, fresh)
        self.backend.synchronize()


def start(req: dict, chan: Channel) -> dict:
    ref = Reference(req)
    chan.send("ready", device=ref.backend.describe_device(), torch_version=torch.__version__,
              precision=ref.precision, memory_guess=ref.memory_guess(), memory_total=ref.backend.memory_total())

    def begin(cmd: dict) -> tuple[str, dict]:
        work = ref.count_work()
        ref.begin(int(cmd["init_seed"]), Path(cmd["public_dir"]))
        return "begun", {"work": work, "weights": len(ref.model.state_dict())}

    def compare(cmd: dict) -> tuple[str, dict]:
        fds = chan.receive_fds(int(cmd["fds"]))
        try:
            return "compared", {"result": ref.compare(cmd["manifest"], fds, cmd["label"])}
        finally:
            close_fds(fds)

    side: dict[str, Calls] = {}  # the candidate attached for the trusted path's calls

    def attach(cmd: Attach) -> Attached:
        sock = socket.socket(fileno=chan.receive_fds(1)[0])
        if "calls" in side:  # the last evaluation's candidate (it is killed by the judge)
            side.pop("calls").close()
        side["calls"] = ref.calls_class()(sock, [cmd.worker_pid], cmd.worker_pid, cmd.read_limit, cgroup=cmd.cgroup,
                                          others=list(cmd.others))
        if cmd.own is not None and not isinstance(side["calls"], GpuCalls):
            side["calls"].sample(Path(cmd.own), ref.req["sample_period_ns"])
        if isinstance(side["calls"], GpuCalls):  # the clock's overheads, measured on the baseline callee
            side["calls"].clock = ref.baseline_calls()
        return Attached(scales=bool(ref.req.get("scaled_inputs")) and ref.scale_holds())

    def on_candidate(fn):
        """A command on the attached candidate's calls: its failures are verdicts, not the reference's."""
        def run(cmd: Check | TimeCandidate) -> CandidateChecked:
            deadline = time.monotonic() + cmd.budget_s
            try:
                return decode(CandidateChecked, fn(side["calls"], cmd, deadline))
            except CallFailed as exc:
                return CandidateChecked(ok=False, reason=str(exc), failed=exc.how)
        return run

    def detach(cmd: Detach) -> Detached:
        calls = side.pop("calls", None)
        if calls is None or not cmd.end:  # (a candidate that failed stays stopped until it is killed)
            if calls is not None:
                calls.close()
            return Detached()
        try:
            return Detached(violations=calls.end())
        except CallFailed as exc:
            return Detached(error=str(exc), failed=exc.how)

    def typed(cls, fn):
        """A handler of the typed commands (wire/trusted_commands.py)."""
        def handle(cmd: dict) -> tuple[str, dict]:
            reply = fn(decode(cls, cmd))
            return reply.EVENT, asdict(reply)
        return handle

    return {
        "attach": typed(Attach, attach),
        "check": typed(Check, on_candidate(lambda calls, cmd, deadline: ref.check_candidate(
            calls, cmd.seed, cmd.shapes, cmd.scale, cmd.label, deadline, cmd.reload))),
        "time_candidate": typed(TimeCandidate, on_candidate(lambda calls, cmd, deadline: {
            "ok": True, "stats": ref.time_calls(calls, cmd.timing, deadline, check_bits=cmd.check_bits,
                                                inputs_checked=True)})),
        "detach": typed(Detach, detach),
        "fit_sizes": typed(FitSizes, lambda cmd: decode(Sizes, ref.fit_sizes(
            {str(k): int(v) for k, v in cmd.shapes.items()}))),
        "begin": begin,
        "trial": lambda cmd: ("trial_ready", ref.run_trial(int(cmd["seed"]), cmd.get("shapes"), cmd.get("scale"),
                                                           cmd.get("fp64", True))),
        "compare": compare,
        "time": lambda cmd: ("baselines", ref.time_baselines()),
        "time_eager": lambda cmd: ("eager_timed", {"stats": ref.time_eager(cmd["timing"])}),
        "kernelbench_time": lambda cmd: ("kernelbench_timed", ref.kernelbench_time(cmd["method"])),
        "prepare": lambda cmd: ("prepared", ref.prepare_baselines(DeviceGate(chan) if cmd.get("gate") else None)),
        "memory": lambda cmd: ("memory", {"bytes": ref.backend.memory_held(), "peak": ref.backend.memory_peak(),
                                          "total": ref.backend.memory_total()}),
    }


if __name__ == "__main__":
    run_worker(start, "task_error")
