"""The agent loop's limits (`cuda-agent optimize` and optimize-suite take their defaults from here)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LoopConfig:
    max_turns: int = 200
    max_context: int = 131_072  # tokens, as reported by the endpoint
    max_invalid: int = 3  # consecutive replies without a usable tool call
    single_turn: bool = False
