"""From timings to the verdict's speed fields and reward, with the checks that need the timeline: where the work ran
(host or device, whose kernels, inside the timed calls or not) and whether the time is physically possible."""

from __future__ import annotations

from typing import Any

from ..config import JudgeConfig
from ..timekeeper import TimingOutcome
from ..verdict import NOISY_TIMING, UNCREDITED, Verdict
from .reward import milestone_reward
from .speed_of_light import bounds, hard_problem

PRECISION_WARN_RATIO = 10.0  # error vs fp64 this many times fp32 eager's: a lower precision is likely
HOST_RATIO, HOST_SLACK_US = 3.0, 200.0  # host time per call beyond this much over device time fails
# Kernels of torch itself (ATen, its CUDA helpers); fills are what the allowed ops (zeros, fill_) launch.
TORCH_KERNEL_PREFIXES = ("void at::", "at::", "void at_cuda_detail::", "void (anonymous namespace)::elementwise")
TORCH_FILL_MARKERS = ("FillFunctor", "fill_kernel")


def torch_kernels(names: list[str]) -> list[str]:
    return [k for k in names if k.startswith(TORCH_KERNEL_PREFIXES)]


def score(config: JudgeConfig, timing_method: str, outcome: TimingOutcome, work: dict[str, Any],
          peaks: dict[str, float] | None, verdict: Verdict) -> None:
    """Fill the verdict's times, speedups, timing record and reward; a timeline problem or a time no honest kernel
    reaches fails the candidate."""
    baselines, stats = outcome.baselines, outcome.candidate
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
    verdict.timing = {"method": timing_method, "status": outcome.record["status"], "baselines": outcome.record,
                      "eager": baselines["eager"], "compile": baselines["compile"], "candidate": stats}
    wrong = outcome.record.get("wrong_timed_calls", 0)  # (kernelbench policy: findings, not failures)
    if outcome.noisy or wrong:  # a speed claim needs a clean comparison of right outputs: correct, nothing more
        verdict.speedup_vs_eager = verdict.speedup_vs_compile = None  # (the times stay in times_us and timing)
        verdict.reward = milestone_reward(True, t, t, t, config.speedup_threshold)
        verdict.warnings.append(f"{UNCREDITED}: {wrong} of the checked timed calls gave wrong outputs (KernelBench's "
                                "rule checks none of them; see strict_findings): reward for correctness only" if wrong
                                else f"{NOISY_TIMING} to credit any speedup (" + "; ".join(outcome.record["problems"])
                                + "): reward for correctness only; rerun on a quieter machine")
    else:
        verdict.reward = milestone_reward(True, t, t_eager, t_compile, config.speedup_threshold)
    verdict.timing["work"] = work
    problem = timeline_problem(config, stats, t) or speed_of_light(config, work, peaks, t, verdict)
    if problem:
        verdict.correct, verdict.reward, verdict.error = False, -1, problem


def speed_of_light(config: JudgeConfig, work: dict[str, Any], peaks: dict[str, float] | None, t: float,
                   verdict: Verdict) -> str | None:
    """Report the bounds; warn when the full one is beaten; a hard one beaten is the failure returned (or a warning
    when `speed_of_light_fails` is off; a strict finding under the kernelbench policy)."""
    if not peaks:
        return None
    bound = bounds(work, peaks, config.allow_tf32)
    verdict.timing["speed_of_light_us"] = bound
    errors = verdict.error_vs_fp64
    ratio = errors.get("ratio") if (errors.get("candidate") or 0.0) > 1e-6 else None  # negligible errors aside
    problem = hard_problem(t, bound, ratio, PRECISION_WARN_RATIO)
    if problem and config.speed_of_light_fails:
        if config.policy != "kernelbench":
            return problem
        verdict.strict_findings.append(problem)  # not KernelBench's rule: what strict would say
    elif problem or t < bound["full"]:
        verdict.warnings.append(problem or (
            f"faster than reading every input and writing every output{' with all its FLOPs' if bound['flops'] else ''}"
            f" at this device's peak allows ({t:.1f} us < {bound['full']:.1f} us): an algebraic shortcut, or a "
            "suspect measurement"))
    return None


def timeline_problem(config: JudgeConfig, stats: dict[str, Any], t: float) -> str | None:
    """The work must happen on the timed device timeline, inside the timed calls, in the candidate's own kernels
    (strict policy); GPU only (the cpu backend's clock is the host's)."""
    kernels = stats.get("kernels")
    if kernels is None:
        return None
    host = stats["host_median_us"]
    if host > HOST_RATIO * t + HOST_SLACK_US:
        return (f"host-side work: the host wall clock per call ({host:.0f} us) far exceeds the device time "
                f"({t:.0f} us); compute must run on the GPU, inside the timed calls")
    late = [k for k in stats.get("outside_kernels") or [] if not k.startswith(TORCH_KERNEL_PREFIXES)]
    if late:
        return (f"kernel {late[0][:80]} ran outside the timed calls (launched after forward returned or between "
                "calls): all work must be done inside the call")
    if config.policy != "strict":
        return None
    torch_compute = [k for k in torch_kernels(kernels) if not any(m in k for m in TORCH_FILL_MARKERS)]
    if torch_compute:
        return (f"policy violation: torch's kernel {torch_compute[0][:100]} ran in the timed calls (compute must "
                "happen in the candidate's own kernels)")
    if not [k for k in kernels if not k.startswith(TORCH_KERNEL_PREFIXES)]:
        return ("none of the candidate's own kernels ran in the timed calls (seen: "
                f"{', '.join(k[:60] for k in kernels) or 'no kernel at all'})")
    return None
