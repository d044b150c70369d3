"""The milestone reward of the CUDA Agent paper.

b(t, t0) = (t0 - t) / t0 > threshold (5%). Reward: -1 if the candidate fails to build, verify or obey the policy;
3 if it beats both eager and torch.compile; 2 if it beats eager only; 1 if it is correct but beats neither.
"""

from __future__ import annotations


def beats(t: float, t0: float | None, threshold: float = 0.05) -> bool:
    return t0 is not None and t0 > 0 and (t0 - t) / t0 > threshold


def milestone_reward(correct: bool, t: float | None, t_eager: float | None, t_compile: float | None,
                     threshold: float = 0.05) -> int:
    if not correct or t is None:
        return -1
    if beats(t, t_eager, threshold):
        return 3 if beats(t, t_compile, threshold) else 2
    return 1
