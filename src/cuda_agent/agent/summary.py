"""What an episode hands on: why it stopped, its outcome and its summary, as typed records (docs/agent.md gives the
JSON they are written as: `summary.json`, and the `result` record that ends `trajectory.jsonl`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from enum import Enum
from typing import Any


class Stop(str, Enum):
    """Why an episode stopped (`EpisodeSummary.stop`; the particulars are in `stop_detail`)."""
    FINISH = "finish"  # the model called `finish`
    TURN_LIMIT = "turn limit"
    CONTEXT_LIMIT = "context limit"
    NO_TOOL_CALL = "no tool call"  # replies in a row without one
    INVALID_TOOL_CALLS = "invalid tool calls"  # tool calls in a row that failed to run
    MODEL_ERROR = "model error"  # the endpoint (or a rollout's sampler) failed
    SINGLE_TURN = "single turn"  # single-turn mode: the reply's files judged once
    NO_FILES = "no files"  # single-turn mode: the reply held no `### FILE:` blocks
    EPISODE_FAILED = "episode failed"  # the episode raised (optimize-suite records it and goes on)
    TIME_LIMIT = "time limit"  # the episode's wall clock (LoopConfig.time_limit_s) ran out
    INTERRUPTED = "interrupted"  # Ctrl-C or SIGTERM: a rerun of optimize-suite plays it again


@dataclass
class LoopState:
    """The loop's state as it runs, handed to the progress callback after each reply (`last_tool` None) and after
    every tool call."""
    turn: int = 0
    last_tool: str | None = None
    reply_tokens: int = 0  # the last reply's: tokens the model wrote, seconds it took, tool calls it made
    reply_s: float = 0.0
    reply_calls: int = 0
    best_reward: int | None = None
    best_speedup: float | None = None  # the best snapshot's speedup over torch.compile
    context_tokens: int = 0
    stop: Stop | None = None
    stop_detail: str = ""

    def stopped(self, reason: Stop, detail: str = "") -> None:
        self.stop, self.stop_detail = reason, detail


@dataclass
class Outcome:
    """`Environment.result()`: the verified candidates and the best one re-judged from a clean copy."""
    snapshots: int = 0
    best_snapshot: int | None = None
    best_dir: str | None = None
    final_verdict: dict[str, Any] | None = None  # Verdict.to_dict() of the re-judged best
    best_single_file: str | None = None  # its single-file export, or why it could not be written

    @property
    def reward(self) -> float:
        """The episode's reward: the re-judged best's, -1 without one."""
        return float(self.final_verdict["reward"]) if self.final_verdict else -1.0


@dataclass
class EpisodeSummary(Outcome):
    """One episode: what ran it, why and when it stopped, and its outcome."""
    reference: str = ""
    model: str = ""
    stop: str = ""  # a `Stop` value
    stop_detail: str = ""
    turns: int = 0
    context_tokens: int = 0
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "EpisodeSummary":
        """From `summary.json` (keys it does not know are ignored; missing ones take their defaults)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

