"""The single-turn warm-up's reward in verl's `compute_score` form (verl config: `custom_reward_function.path:
pkg://cuda_agent.rl.verl_reward`, `name: compute_score`).

The reply is judged exactly as `cuda-agent train --stage warmup` judges one: replayed through the agent's loop in
single-turn mode (`### FILE:` blocks written into a fresh workspace of the task, profiled, the best snapshot
re-judged), on the process's shared judge pool; the score is the final verdict's milestone reward (-1 when nothing
verified). The row's `extra_info` carries the reference source and backend (`verl_data.verl_rows`).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from ..agent.environment import Environment
from ..agent.loop import LoopConfig, run_episode
from ..judge.pool import shared_pool
from ..llm import ScriptedClient


def compute_score(data_source: str, solution_str: str, ground_truth: Any = None, extra_info: dict | None = None,
                  **kwargs) -> dict[str, Any]:
    extra = extra_info or {}
    if not extra.get("reference"):
        raise ValueError("extra_info has no 'reference' (the task's source): export rows with verl_data.verl_rows")
    pool = shared_pool(extra.get("backend", "cuda"), judge=extra.get("judge", "local"))
    root = Path(tempfile.gettempdir()) / "cuda-agent-rewards"  # every reward's episode beside the others
    root.mkdir(exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="reward-", dir=root))
    try:
        task = folder / "task.py"
        task.write_text(extra["reference"])
        summary = run_episode(Environment(pool, folder / "run", use_sandbox=pool.sandboxed, episodes_root=root),
                              ScriptedClient([{"role": "assistant", "content": solution_str}]), task, folder / "run",
                              LoopConfig(single_turn=True))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    final = summary.final_verdict or {}
    return {"score": summary.reward, "correct": bool(final.get("correct")),
            "speedup_vs_compile": final.get("speedup_vs_compile") or 0.0, "stop": summary.stop,
            "stop_detail": summary.stop_detail}
