"""How well a critic foresees held-out episodes (the recipe reports it after value pretraining): its value before
each model token of episodes it never trained on, against the episode's return (gamma 1, lambda 1: the final
reward), as explained variance. Episodes are read back from their run folders and tokenized turn by turn as the
rft stage does (their text, not the sampled ids, which run folders do not keep)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..agent.summary import EpisodeSummary
from ..agent.tools import schemas
from .algorithm import explained_variance
from .models import Critic
from .rft import read_trajectory
from .stages import critic_beside
from .tokens import TurnTokenizer, conversation_ids


def critic_explained_variance(checkpoint: Path, run_dirs: list[Path], compact: bool, device: str = "cpu") -> dict:
    """`checkpoint`: a stage's checkpoint folder (actor/ with the tokenizer, critic/)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint / "actor")
    critic = Critic.load(critic_beside(checkpoint / "actor"), device).eval()  # (none: says why)
    turns = TurnTokenizer(tokenizer, schemas(compact), tool_format="text")
    values, returns, masks, rewards = [], [], [], []
    for run in run_dirs:
        records = read_trajectory(Path(run) / "trajectory.jsonl")
        messages = [r["message"] for r in records if r.get("type") in ("system", "user", "assistant", "tool")]
        try:
            trajectory = conversation_ids(turns, messages)
        except ValueError:  # no model turn
            continue
        reward = EpisodeSummary.from_dict(json.loads((Path(run) / "summary.json").read_text())).reward
        ids = torch.tensor([trajectory.ids], device=device)
        with torch.no_grad():
            value = critic(ids, torch.ones_like(ids))[0, trajectory.prompt_length - 1:len(trajectory.ids) - 1]
        mask = torch.tensor(trajectory.mask, dtype=torch.float)
        values.append(value.float().cpu())
        returns.append(torch.full_like(mask, reward))
        masks.append(mask)
        rewards.append(reward)
    if not values:
        return {"explained_variance": None, "episodes": 0}
    ev = explained_variance(torch.cat(values), torch.cat(returns), torch.cat(masks))
    return {"explained_variance": None if ev != ev else ev, "episodes": len(values),  # NaN: every return equal
            "mean_return": sum(rewards) / len(rewards)}
