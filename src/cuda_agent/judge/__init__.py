"""The trusted judge: build, verify, audit and time a candidate against a reference; turn it into a reward.

`Judge` and `Verdict` load on first use (they import torch); the settings do not, so a command line can read their
defaults at once.
"""

from .config import JudgeConfig, PolicyConfig

__all__ = ["Judge", "JudgeConfig", "PolicyConfig", "Verdict"]


def __getattr__(name: str):
    if name == "Judge":
        from .judge import Judge

        return Judge
    if name == "Verdict":
        from .verdict import Verdict

        return Verdict
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
