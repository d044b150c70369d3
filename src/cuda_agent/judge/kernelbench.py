"""KernelBench's evaluation protocol, the pieces that decide a `--policy kernelbench` verdict (issue 33).

KernelBench (ScalingIntelligence/KernelBench, `eval_kernel_against_ref` and `run_and_check_correctness`) never
loads a state dict: it seeds torch's generators with one seed (42) before `get_init_inputs()`, again before
constructing `Model` and again before constructing `ModelNew`, both on the CPU and then moved to the device, so a
`ModelNew` that creates the same parameters in the same order holds the same weights whatever it names them. Its
correctness trials draw their seeds from that seed (`trial_seeds`), each trial's inputs made on the CPU after
seeding and then moved (`inputs`), and compare one output with `torch.allclose` at one tolerance for atol and rtol
(`compare`): 1e-2 in the releases whose numbers were published (v0.1; its newer code uses 1e-4 for fp32).

Everything here runs on the trusted side (the reference worker), except `construct`, which both sides run: the
candidate's construction only makes the weights its outputs are then compared with.
"""

from __future__ import annotations

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
