"""The agent: an environment over a workspace (tools served by the judge and the sandbox), chat clients for any
OpenAI-compatible endpoint, and the loop that connects them (`cuda-agent optimize`)."""

from .environment import Environment, StepResult
from ..llm import LLMError, OpenAIClient, ScriptedClient
from .loop import LoopConfig, run_episode
from .summary import EpisodeSummary, LoopState, Outcome, Stop

__all__ = ["Environment", "StepResult", "LLMError", "OpenAIClient", "ScriptedClient", "LoopConfig", "run_episode",
           "EpisodeSummary", "LoopState", "Outcome", "Stop"]
