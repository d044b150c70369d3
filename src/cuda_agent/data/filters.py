"""Filter: each rule a named check with its threshold, run on one task's source in a worker process.

`check_task` runs the execution rules (eager and torch.compile agree, deterministic, not degenerate, well
conditioned, runtime in the window, after scaling the batch toward the window); the similarity rules need the
whole dataset and run in the builder (`build.py`). Every result carries the measured value and the threshold, so
the export says why a task was kept or rejected. Runtimes come from the judge's own timing loop (on CUDA: device
time of every stream, L2 flushed), so the window holds for the eager time the judge will measure; model-written
tasks run in the judge's sandboxed worker process and answer on its private channel.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..backend import Backend, get_backend
from ..judge.config import JudgeConfig
from ..judge.trusted.compare import compare_tensor
from ..judge.wire.timing import time_callable
from .taskfile import load, with_batch


@dataclass
class FilterConfig:
    device: str = "cpu"
    window_ms: tuple[float, float] = (1.0, 100.0)
    compile_tolerance: float = 1e-3  # eager vs torch.compile, relative to the output's scale
    min_output_scale: float = 1e-2  # max |output| below this: zeros would pass a 1e-2 tolerance
    min_change: float = 1e-3  # relative change of the output with other inputs / other weights
    timing_iters: int = 5
    check_compile: bool = True
    max_input_elements: int = 1 << 28  # BATCH is never scaled beyond this many input elements
    scaling_rounds: int = 4  # measure, rescale BATCH, measure again, at most this many times
    memory_budget_gb: float = 8.0  # cuda: this process's share of the GPU (workers share one GPU); BATCH fits a third
    atol: float = JudgeConfig.atol  # the judge's tolerance: float32 eager must be within it of float64 everywhere
    rtol: float = JudgeConfig.rtol


@dataclass
class Check:
    name: str
    passed: bool
    value: Any = None
    threshold: Any = None
    detail: str = ""


@dataclass
class TaskResult:
    source: str
    checks: list[Check] = field(default_factory=list)
    eager_ms: float | None = None
    compile_ms: float | None = None
    output_stats: dict[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def rejected_by(self) -> str | None:
        return next((c.name for c in self.checks if not c.passed), None)

    def to_dict(self) -> dict:
        return asdict(self)


def _run(module, device: str, input_seed: int, model=None):
    torch.manual_seed(0)
    if model is None:
        with torch.device(device):
            model = module.Model(*module.get_init_inputs()).eval()
    torch.manual_seed(input_seed)
    with torch.device(device):
        inputs = module.get_inputs()
    with torch.no_grad():
        return model(*inputs), model, inputs


def _ms(fn, backend: Backend, iters: int) -> float:
    """Median milliseconds of `iters` calls after one warm-up, timed as the judge times the eager baseline."""
    def call():
        with torch.no_grad():
            fn()

    return time_callable(call, backend, warmup=1, min_iters=iters, max_iters=iters, target_time_s=0.0)[
        "median_us"] / 1e3


CHUNK = 1 << 24  # elements per step of the float64 reductions below (bounded memory on large outputs)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b||, accumulated in float64 a chunk at a time."""
    a, b = a.reshape(-1), b.reshape(-1)
    diff = ref = 0.0
    for i in range(0, b.numel(), CHUNK):
        x, y = a[i:i + CHUNK].double(), b[i:i + CHUNK].double()
        diff += float((x - y).square().sum())
        ref += float(y.square().sum())
    return (diff ** 0.5) / (ref ** 0.5 + 1e-30)


def _moments(t: torch.Tensor) -> tuple[float, float]:
    """Mean and (sample) standard deviation in float64, a chunk at a time."""
    t, n = t.reshape(-1), t.numel()
    total = sum(float(t[i:i + CHUNK].double().sum()) for i in range(0, n, CHUNK))
    mean = total / max(1, n)
    sq = sum(float((t[i:i + CHUNK].double() - mean).square().sum()) for i in range(0, n, CHUNK))
    return mean, (sq / (n - 1)) ** 0.5 if n > 1 else 0.0


def _rounding_jumps(model: torch.nn.Module, inputs: list, out: torch.Tensor, cfg: FilterConfig) -> tuple[bool, str]:
    """Whether the float64 model's output (same weights, same inputs), rounded to float32, passes the judge's own
    comparison against float32 eager: a threshold after rounding-sensitive math (hardshrink of a mish) lands on the
    other side of its step for some inputs, and then an exact kernel fails the judge as often as a fast-math one.
    (True, why) where float64 cannot run it."""
    try:
        wide = copy.deepcopy(model).double()
        with torch.no_grad():
            ref = wide(*[x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs])
    except (RuntimeError, TypeError, NotImplementedError) as exc:  # no float64 kernel, or no room for it
        return True, f"not checked: float64 did not run ({type(exc).__name__}: {str(exc)[:120]})"
    if not isinstance(ref, torch.Tensor) or ref.shape != out.shape:
        return True, "not checked: float64 gave another output"
    judged = compare_tensor(ref.to(out.dtype), out, None, cfg.atol, cfg.rtol, "the float64 model's output")
    return judged["ok"], ("float32 within the judge's tolerance of float64 everywhere" if judged["ok"] else
                          f"{judged['reason']}: the output jumps under rounding (an exact kernel fails the judge)")


def _perturbed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """The model with every parameter moved by noise (constant-initialised ones, e.g. norm weights, too)."""
    other = copy.deepcopy(model)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            noise = torch.randn(p.shape, generator=gen).to(p.device, p.dtype)
            p.add_(noise * 0.5 * max(float(p.abs().mean()), 0.1))
    return other


def check_task(source: str, cfg: FilterConfig) -> TaskResult:
    """Run the execution rules, scaling BATCH toward the runtime window first; stops at the first failure."""
    result = TaskResult(source)
    checks = result.checks
    backend = get_backend(cfg.device)
    if cfg.device == "cuda":  # a fixed share, so that what fits does not depend on the other workers
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cfg.memory_budget_gb * 2**30 / total))
        torch.cuda.reset_peak_memory_stats()
    try:
        module = load(source)
        out, model, inputs = _run(module, cfg.device, 0)
    except (Exception, SystemExit) as exc:  # a task's code can do anything
        checks.append(Check("runs_in_eager", False, detail=f"{type(exc).__name__}: {str(exc)[:200]}"))
        return result
    if not isinstance(out, torch.Tensor) or not out.is_floating_point():
        checks.append(Check("runs_in_eager", False, detail="the output is not one floating-point tensor"))
        return result
    checks.append(Check("runs_in_eager", True))

    # Runtime window: scale BATCH toward the window's geometric middle. Small sizes are launch-bound (time does
    # not grow with BATCH yet), so the scaling is repeated from each new measurement.
    lo, hi = cfg.window_ms
    ms = _ms(lambda: model(*inputs), backend, cfg.timing_iters)
    batch = getattr(module, "BATCH", None)
    scalable = "BATCH = " in source and isinstance(batch, int) and bool(inputs) and isinstance(inputs[0], torch.Tensor)
    for _ in range(cfg.scaling_rounds if scalable else 0):
        if lo <= ms <= hi:
            break
        per_item = max(1, inputs[0].numel() // batch)
        cap = max(1, cfg.max_input_elements // per_item)
        if cfg.device == "cuda":  # the later checks hold several outputs at once: the run may use a third
            per_batch = torch.cuda.max_memory_allocated() / batch
            cap = max(1, min(cap, int(cfg.memory_budget_gb * 2**30 / 3 / per_batch)))
        new_batch = max(1, min(cap, round(batch * (lo * hi) ** 0.5 / max(ms, 1e-3))))
        if new_batch == batch:
            break
        try:
            scaled = with_batch(source, new_batch)
            module = load(scaled)
            del out, model, inputs
            if cfg.device == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            out, model, inputs = _run(module, cfg.device, 0)
            ms = _ms(lambda: model(*inputs), backend, cfg.timing_iters)
            source = result.source = scaled
            batch = new_batch
        except Exception as exc:  # e.g. out of memory at the larger batch
            checks.append(Check("runtime_window", False, round(ms, 4), [lo, hi],
                                f"BATCH={new_batch} failed: {type(exc).__name__}: {str(exc)[:150]}"))
            return result
    result.eager_ms = ms
    checks.append(Check("runtime_window", lo <= ms <= hi, round(ms, 4), [lo, hi], "eager ms"))
    if not checks[-1].passed:
        return result

    try:
        _later_checks(result, module, model, inputs, out, cfg, backend)
    except Exception as exc:  # e.g. out of memory holding several outputs: rejected by the check that ran
        stage = ["deterministic", "not_degenerate", "well_conditioned", "runs_in_compile"][len(checks) - 2]
        checks.append(Check(stage, False, detail=f"{type(exc).__name__}: {str(exc)[:200]}"))
    return result


def _later_checks(result: TaskResult, module, model, inputs, out, cfg: FilterConfig, backend: Backend) -> None:
    """Determinism, degeneracy and torch.compile agreement, at the batch size the window chose."""
    checks = result.checks
    again, _, _ = _run(module, cfg.device, 0)
    with torch.no_grad():
        second_call = model(*inputs)  # the RNG has moved on: a stochastic op shows here
    same = lambda a, b: bool(torch.equal(a, b)) or bool(torch.isnan(a).all() and torch.isnan(b).all())  # noqa: E731
    problem = ("the same seeds gave different outputs" if not same(out, again) else
               "a second call on the same inputs gave a different output (stochastic op)"
               if not same(out, second_call) else "")
    checks.append(Check("deterministic", not problem, detail=problem or "same inputs, same output"))
    del again, second_call
    if problem:
        return

    finite = bool(torch.isfinite(out).all())
    scale = float(out.abs().max()) if finite and out.numel() else 0.0
    mean, std = _moments(out) if finite else (float("nan"), 0.0)
    result.output_stats = {"mean": mean, "std": std, "abs_max": scale, "numel": out.numel()}
    other_inputs, _, _ = _run(module, cfg.device, 1, model=model)
    d_inputs = _rel(other_inputs, out) if finite else 0.0
    del other_inputs
    d_weights = None
    if any(True for _ in model.parameters()):
        with torch.no_grad():
            other_weights = _perturbed(model, 1)(*inputs)
        d_weights = _rel(other_weights, out) if finite else 0.0
        del other_weights
    problems = []
    if not finite:
        problems.append("NaN or Inf in the output")
    elif scale < cfg.min_output_scale:
        problems.append(f"output scale {scale:.2e} < {cfg.min_output_scale} (zeros would pass)")
    elif result.output_stats["std"] == 0.0:
        problems.append("constant output")
    elif d_inputs < cfg.min_change:
        problems.append(f"output barely depends on the inputs ({d_inputs:.2e})")
    elif d_weights is not None and d_weights < cfg.min_change:
        problems.append(f"output barely depends on the weights ({d_weights:.2e})")
    checks.append(Check("not_degenerate", not problems, {"scale": scale, "change_inputs": d_inputs,
                                                          "change_weights": d_weights},
                        {"min_scale": cfg.min_output_scale, "min_change": cfg.min_change}, "; ".join(problems)))
    if problems:
        return

    holds, detail = _rounding_jumps(model, inputs, out, cfg)
    checks.append(Check("well_conditioned", holds, detail=detail))
    if not holds:
        return

    if cfg.check_compile:
        try:
            compiled = torch.compile(model)
            with torch.no_grad():
                c_out = compiled(*inputs)
            err = _rel(c_out, out)
            result.compile_ms = _ms(lambda: compiled(*inputs), backend, cfg.timing_iters)
            checks.append(Check("runs_in_compile", err <= cfg.compile_tolerance, err, cfg.compile_tolerance,
                                "relative error of torch.compile vs eager"))
        except Exception as exc:
            checks.append(Check("runs_in_compile", False, detail=f"{type(exc).__name__}: {str(exc)[:200]}"))


def check_task_sandboxed(source: str, cfg: FilterConfig, workdir: Path, timeout_s: float = 1800.0) -> TaskResult:
    """`check_task` in the judge's sandboxed worker process, for code the pipeline did not write itself (the LLM
    composer's): no network, no writes outside `workdir`, the judge's and the user's files out of sight, and the
    result sent on the worker's private channel (what the task prints cannot pose as a result)."""
    from .. import sandbox
    from ..judge.wire.process import WorkerDied, WorkerProcess

    def failed(detail: str) -> TaskResult:
        return TaskResult(source, [Check("runs_in_eager", False, detail=detail)])

    if sandbox.probe() is not None:
        return failed(f"sandbox unavailable: LLM-written code is not run outside it ({sandbox.probe()})")
    workdir.mkdir(parents=True, exist_ok=True)
    box = sandbox.Sandbox(sandbox.View(writable=[workdir]), sandbox.Limits(cpu_seconds=3600), cwd=workdir)
    env = {"HOME": "/tmp", "TORCHINDUCTOR_CACHE_DIR": "/tmp/inductor"}
    worker = WorkerProcess("cuda_agent.data.filters", {"source": source, "config": asdict(cfg)}, workdir, env, box,
                           trusted=False)
    try:
        msg = worker.receive(time.monotonic() + timeout_s)
    except WorkerDied as exc:
        return failed(f"the checking process {exc}"[:300])
    finally:
        worker.close()
    if msg.get("event") != "result":
        return failed(str(msg.get("error", msg))[:300])
    msg["checks"] = [Check(**c) for c in msg["checks"]]
    return TaskResult(**{k: msg[k] for k in ("source", "checks", "eager_ms", "compile_ms", "output_stats")})


def _start(request: dict, chan) -> dict:
    raw = dict(request["config"], window_ms=tuple(request["config"]["window_ms"]))
    chan.send("result", **check_task(request["source"], FilterConfig(**raw)).to_dict())
    return {}


def main() -> None:
    """Sandboxed entry point: python -m cuda_agent.data.filters REQUEST.json (the judge's worker protocol)."""
    from ..judge.wire.process import run_worker

    run_worker(_start, "filter_error")


if __name__ == "__main__":
    main()
