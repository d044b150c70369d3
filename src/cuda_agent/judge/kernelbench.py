"""KernelBench's evaluation protocol, the pieces that decide a `--policy kernelbench` verdict (issue 33).

KernelBench (ScalingIntelligence/KernelBench, `eval_kernel_against_ref` and `run_and_check_correctness`) never
loads a state dict: it seeds torch's generators with one seed (42) before `get_init_inputs()`, again before
constructing `Model` and again before constructing `ModelNew`, both on the CPU and then moved to the device, so a
`ModelNew` that creates the same parameters in the same order holds the same weights whatever it names them. Its
correctness trials draw their seeds from that seed (`trial_seeds`), each trial's inputs made on the CPU after
seeding and then moved (`inputs`), and compare one output with `torch.allclose` at one tolerance for atol and rtol
(`compare`): 1e-2 in the releases whose numbers were published (v0.1; its newer code uses 1e-4 for fp32).

Everything here runs on the trusted side (the reference worker), except `construct`, which both sides run: the
candidate's construction only makes the weights its outputs are then compared with; and its timing method
(`TIMINGS`, `time_calls`), which `--timing kernelbench` runs beside the judge's own clock and never in a verdict's
decision (kernelbench_timing.py).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

SEED = 42  # the seed of weights, init inputs and the trials' seeds
TRIALS = 5  # correctness trials (its scripts' default)
TOLERANCE = 1e-2  # atol = rtol (v0.1, fp32)


def set_seed(seed: int) -> None:
    """Its `set_seed`: the CPU generator and the current CUDA device's."""
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed(seed)


def trial_seeds(seed: int = SEED, trials: int = TRIALS) -> list[int]:
    """The seeds of its correctness trials: drawn one by one from torch's CPU generator seeded with `seed`."""
    torch.manual_seed(seed)
    return [int(torch.randint(0, 2**32 - 1, (1,)).item()) for _ in range(trials)]


def _to(x: Any, device: str) -> Any:
    return x.to(device) if isinstance(x, torch.Tensor) else x


def init_inputs(get_init_inputs: Callable[[], list], device: str, seed: int = SEED) -> list:
    """`get_init_inputs()` after seeding, its tensors moved to the device."""
    set_seed(seed)
    return [_to(x, device) for x in get_init_inputs()]


def construct(cls: Callable[..., torch.nn.Module], init: list, device: str, seed: int = SEED) -> torch.nn.Module:
    """`cls(*init)` built after seeding, on the CPU (its default device), then moved to `device`: the weights
    KernelBench gives `Model` and `ModelNew` alike."""
    set_seed(seed)
    with torch.device("cpu"):
        module = cls(*init)
    return module.to(device)


def inputs(get_inputs: Callable[[], list], seed: int, device: str) -> list:
    """One trial's inputs: `get_inputs()` after seeding with the trial's seed, made on the CPU, then moved."""
    set_seed(seed)
    with torch.device("cpu"):
        made = get_inputs()
    return [_to(x, device) for x in made]


def compare(ref: Any, got: Any, atol: float = TOLERANCE, rtol: float = TOLERANCE) -> str | None:
    """Its correctness rule for one trial's output: None when it passes, else why not (its reasons: a shape
    mismatch, values outside `torch.allclose(ref, got, atol, rtol)` (NaN never equal; equal infinities equal), or
    what `allclose` raised: another dtype, another kind of object)."""
    if not isinstance(ref, torch.Tensor) or not isinstance(got, torch.Tensor):
        if isinstance(ref, torch.Tensor) != isinstance(got, torch.Tensor):
            return f"output is a {type(got).__name__}, expected a {type(ref).__name__}"
        return None if ref == got else f"output {got!r}, expected {ref!r}"
    if ref.shape != got.shape:
        return f"Output shape mismatch: Expected {tuple(ref.shape)}, got {tuple(got.shape)}"
    try:
        close = torch.allclose(ref, got, atol=atol, rtol=rtol)
    except RuntimeError as exc:
        return f"allclose raised: {exc}"
    if close:
        return None
    diff = (ref.double() - got.double()).abs()
    return f"Output mismatch: max difference {float(diff.max()):.6g}, mean {float(diff.mean()):.6g}"


@dataclass(frozen=True)
class TimingMethod:
    """How one KernelBench revision times a model: CUDA events around each call, after `warmup` calls (the
    reference's: `ref_warmup`), `trials` kept after discarding the first `discard_first`; with `flush_l2`, 256 MB
    of int64 written before each trial and the device synchronised before and after it; the runtime is the mean."""
    name: str
    revision: str
    warmup: int
    ref_warmup: int
    trials: int
    discard_first: int
    flush_l2: bool


TIMINGS = {
    # src/kernelbench/timing.py from b6c5259 (2026-01-19): time_execution_with_cuda_event; measure_ref_program_time
    "kernelbench": TimingMethod("kernelbench", "b6c5259 (2026-01-19)", warmup=3, ref_warmup=5, trials=100,
                                discard_first=1, flush_l2=True),
    # src/eval.py and scripts/generate_baseline_time.py of the first release, whose numbers were published
    "kernelbench-v0.1": TimingMethod("kernelbench-v0.1", "48642c5 (2024-12)", warmup=3, ref_warmup=3, trials=100,
                                     discard_first=0, flush_l2=False),
}


def time_calls(fn: Callable[..., Any], args: list, method: TimingMethod, device: str, reference: bool = False
               ) -> list[float]:
    """Its timing loop: milliseconds per kept trial. On the cpu backend (KernelBench has none) the host clock
    around each call takes the events' place, and there is no cache to flush."""
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(method.ref_warmup if reference else method.warmup):
        fn(*args)
        sync()
    if cuda and method.flush_l2:
        torch.cuda.empty_cache()
    times = []
    for trial in range(method.trials + method.discard_first):
        if method.flush_l2:
            sync()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if method.flush_l2:
                torch.empty((32, 1024, 1024), dtype=torch.int64, device="cuda").fill_(42)
            start.record()
            fn(*args)
            end.record()
            sync()
            ms = start.elapsed_time(end)
        else:
            began = time.perf_counter()
            fn(*args)
            ms = (time.perf_counter() - began) * 1e3
        if trial >= method.discard_first:
            times.append(ms)
    return times


def timing_stats(times: list[float]) -> dict[str, float]:
    """Its summary of one timing (mean, std (population), min, max in ms; num_trials)."""
    mean = sum(times) / len(times)
    std = math.sqrt(sum((t - mean) ** 2 for t in times) / len(times))
    return {"mean": mean, "std": std, "min": min(times), "max": max(times), "num_trials": len(times)}
