"""The trusted judge: build, verify, audit and time a candidate against a reference; turn it into a reward."""

from .config import JudgeConfig, PolicyConfig
from .judge import Judge
from .verdict import Verdict

__all__ = ["Judge", "JudgeConfig", "PolicyConfig", "Verdict"]
