"""Tasks as rows of verl's RL dataset (parquet), the data `cuda-agent train verl` hands to verl's trainer.

One row per task: `data_source` "cuda_agent"; `prompt`, the episode's opening messages as the model sees them (the
tools' descriptions in the system message for the agent: verl's dataset filters prompts by this length, which
without them was 1,667 SmolLM2 tokens where the model read 2,751; the agent loop builds the same messages itself
from the reference); `ability`;
`reward_model` (style "judge": the reward is the judge's verdict, there is no ground truth); `extra_info` (index,
task name, backend and the reference's source, which the agent loop judges against); `agent_name` "cuda_agent"
(`rl/verl_loop.py`).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..agent.environment import opening_messages
from ..agent.loop import SINGLE_TURN
from ..agent.tools import SCHEMAS
from ..llm import with_text_tools
from .rft import RFTFilter, export

AGENT_NAME = "cuda_agent"


def verl_rows(tasks: list[Path], backend: str, single_turn: bool = False, judge: str = "local") -> list[dict]:
    """One row per task; `single_turn` (the warm-up, judged by `verl_reward.compute_score`) adds the request for
    every file in one reply that the agent's single-turn mode sends; `judge` says where the reward judges
    (`judge.pool.shared_pool`)."""
    rows = []
    for index, task in enumerate(tasks):
        source = Path(task).read_text()
        opening = opening_messages(source, backend)
        prompt = opening + [{"role": "user", "content": SINGLE_TURN}] if single_turn else with_text_tools(opening,
                                                                                                        SCHEMAS)
        rows.append({"data_source": "cuda_agent", "prompt": prompt,
                     "ability": "cuda_kernels", "reward_model": {"style": "judge", "ground_truth": ""},
                     "extra_info": {"index": index, "task": Path(task).stem, "backend": backend, "judge": judge,
                                    "reference": source},
                     "agent_name": AGENT_NAME})
    return rows


def rft_rows(runs: list[Path], folder: Path) -> list[dict]:
    """The trajectories of `runs` that pass the RFT filter (`rft.export`, its files in `folder`) as verl's
    multi-turn SFT rows (`messages`): tools described in the system message and every call written as the
    `<tool_call>` text a text-tools model writes, tool results as `<tool_response>` turns."""
    export(runs, folder, RFTFilter())
    rows = []
    for line in (folder / "rft.jsonl").read_text().splitlines():
        if line.strip():
            kept = json.loads(line)
            rows.append({"messages": with_text_tools(json.loads(kept["messages"]), json.loads(kept["tools"]))})
    return rows


def write_parquet(rows: list[dict], path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
