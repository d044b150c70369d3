"""The agent loop's limits (`cuda-agent optimize` and optimize-suite take their defaults from here)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LoopConfig:
    max_turns: int = 200
    max_context: int = 131_072  # tokens, as reported by the endpoint
    max_invalid: int = 3  # consecutive replies without a usable tool call
    max_calls_per_reply: int = 16  # tool calls run from one reply (the rest answered as not run)
    tool_output_chars: int | None = None  # each tool result cut to its head and tail of this many characters
    time_limit_s: float | None = None  # the episode's wall clock, checked before each reply and tool call; None: none
    single_turn: bool = False
