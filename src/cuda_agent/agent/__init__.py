"""The agent: an environment over a workspace (tools served by the judge and the sandbox), chat clients for any
OpenAI-compatible endpoint, and the loop that connects them (`cuda-agent optimize`).

Its names load on first use (the command line reads `config.LoopConfig`'s defaults without importing the judge).
"""

from importlib import import_module

_HOMES = {"Environment": ".environment", "StepResult": ".environment", "LLMError": "..llm",
          "OpenAIClient": "..llm", "ScriptedClient": "..llm", "LoopConfig": ".config", "run_episode": ".loop",
          "EpisodeSummary": ".summary", "LoopState": ".summary", "Outcome": ".summary", "Stop": ".summary"}
__all__ = list(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_HOMES[name], __name__), name)
