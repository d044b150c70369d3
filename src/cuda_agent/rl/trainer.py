"""One PPO step on a batch of rollouts, checkpoints that resume, and metrics per step (metrics.jsonl, TensorBoard).

Engine-agnostic pieces for a single-GPU trainer: the actor and critic live on one device, a batch is a few dozen
episodes, and how an episode's response log-probs are computed is the caller's (`Batch.logprob_fn`): over the whole
vocabulary for free text, over the allowed tokens for constrained replies (rl/choice.py).
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from .algorithm import (advantages_and_returns, explained_variance, group_advantages, masked_mean, masked_whiten,
                        outcome_rewards, ppo_losses, uniform)
from .config import TrainConfig
from .models import Actor, Critic

# logprob_fn(actor model, ids, attention) -> (log-probs [B, T], entropy [B, T]) over the response's T positions
LogprobFn = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class Batch:
    """Episodes padded to one length: `ids` [B, L] (prompt, then the response from `response_start`), `attention`
    [B, L], over the response's T tokens `mask` [B, T] (1 on model tokens) and `old_logp` [B, T] (the sampler's),
    and one `score` per episode (the milestone reward of its final verdict); `groups` [B]: which episodes share a
    task (StageConfig.group), None when the critic is the baseline."""
    ids: torch.Tensor
    attention: torch.Tensor
    response_start: int
    mask: torch.Tensor
    old_logp: torch.Tensor
    scores: torch.Tensor
    groups: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.ids.shape[0]

    def rows(self, index: torch.Tensor) -> Batch:
        return Batch(self.ids[index], self.attention[index], self.response_start, self.mask[index],
                     self.old_logp[index], self.scores[index], None if self.groups is None else self.groups[index])


class PPOTrainer:
    def __init__(self, actor: Actor, critic: Critic, config: TrainConfig, logprob_fn: LogprobFn):
        self.actor, self.critic, self.config, self.logprob_fn = actor, critic, config, logprob_fn
        self.actor_optim = torch.optim.AdamW([p for p in actor.parameters() if p.requires_grad], lr=config.actor_lr,
                                             weight_decay=0.0)  # (with LoRA: its updates only)
        self.critic_optim = torch.optim.AdamW([  # (with LoRA: its updates and the head)
            {"params": [p for name, p in critic.named_parameters() if p.requires_grad and not name.startswith("head.")],
             "lr": config.critic_lr},
            {"params": critic.head.parameters(), "lr": config.value_head_lr}], weight_decay=0.0)
        self.bf16 = config.bf16 if config.bf16 is not None else actor.device.type == "cuda"
        if config.gradient_checkpointing:
            actor.model.gradient_checkpointing_enable()
            critic.backbone.gradient_checkpointing_enable()
        self.reference = None
        if config.ppo.kl_coef:  # the frozen starting policy the KL term pulls towards
            self.reference = actor.frozen_copy()
        self.step = 0
        self.base: Path | None = None  # the model the actor started from (a LoRA adapter names it)
        self.critic_base: Path | None = None  # the critic's
        self.updating = False  # the weights are being changed (a step's update begun, not ended): no checkpoint now

    def autocast(self):
        """bf16 compute over fp32 weights (the optimizers step fp32 master weights), when configured."""
        return torch.autocast(self.actor.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    def _values(self, batch: Batch) -> torch.Tensor:
        with self.autocast():
            values = self.critic(batch.ids, batch.attention)  # the value before each next token
        start, length = batch.response_start - 1, batch.mask.shape[1]
        return values[:, start:start + length].float()

    def update(self, batch: Batch, train_actor: bool = True) -> dict[str, float]:
        """GAE from the critic's values before the update (the actor's advantages from the groups' means instead
        when the batch has `groups`), then `epochs` x `minibatches` PPO steps. With
        `train_actor=False` only the critic learns, unclipped (value pretraining); so it does on a batch whose
        episodes all scored the same (`PPOConfig.skip_uniform`, algorithm.py says why)."""
        cfg = self.config
        device = self.actor.device
        batch = Batch(batch.ids.to(device), batch.attention.to(device), batch.response_start,
                      batch.mask.to(device).float(), batch.old_logp.to(device).float(), batch.scores.to(device).float(),
                      None if batch.groups is None else batch.groups.to(device))
        with torch.no_grad(), self.autocast():
            old_values = self._values(batch)
            old_logp, _ = self.logprob_fn(self.actor.model, batch.ids, batch.attention)
            ref_logp = (self.logprob_fn(self.reference, batch.ids, batch.attention)[0]
                        if self.reference is not None else None)
        with torch.no_grad():
            rewards = outcome_rewards(batch.scores, batch.mask)
            advantages, returns = advantages_and_returns(rewards, old_values, batch.mask, cfg.ppo)
            if batch.groups is not None:  # the critic learns its returns; the actor's baseline is the group's mean
                advantages = group_advantages(batch.scores, batch.groups, batch.mask)
            if cfg.ppo.whiten_advantages:  # over the whole batch, not per minibatch
                advantages = masked_whiten(advantages, batch.mask)
        skipped = train_actor and cfg.ppo.skip_uniform and uniform(batch.scores)
        ppo = replace(cfg.ppo, whiten_advantages=False, value_clip=cfg.ppo.value_clip if train_actor else None)
        train_actor = train_actor and not skipped
        stats: dict[str, list[float]] = {}
        self.actor.train(), self.critic.train()  # (checkpointing applies in training mode only)
        size = len(batch)
        per = max(1, math.ceil(size / cfg.minibatches))
        self.updating = True
        for _ in range(cfg.epochs):
            order = torch.randperm(size, device=device)
            for first in range(0, size, per):
                index = order[first:first + per]
                mb = batch.rows(index)
                with self.autocast(), torch.set_grad_enabled(train_actor):  # (the critic alone: no actor graph)
                    logp, token_entropy = self.logprob_fn(self.actor.model, mb.ids, mb.attention)
                values = self._values(mb)
                actor_loss, critic_loss, mb_stats = ppo_losses(
                    ppo, logp, old_logp[index], advantages[index], values, old_values[index], returns[index],
                    mb.mask, ref_logp[index] if ref_logp is not None else None, token_entropy, batch.old_logp[index])
                if train_actor:
                    self.actor_optim.zero_grad(set_to_none=True)
                    actor_loss.backward()
                    mb_stats["actor_grad_norm"] = float(torch.nn.utils.clip_grad_norm_(
                        self.actor.parameters(), cfg.max_grad_norm))
                    self.actor_optim.step()
                self.critic_optim.zero_grad(set_to_none=True)
                critic_loss.backward()
                mb_stats["critic_grad_norm"] = float(torch.nn.utils.clip_grad_norm_(
                    self.critic.parameters(), cfg.max_grad_norm))
                self.critic_optim.step()
                for key, value in mb_stats.items():
                    stats.setdefault(key, []).append(value)
        self.actor.eval(), self.critic.eval()
        self.step += 1
        self.updating = False
        out = {key: sum(v) / len(v) for key, v in stats.items()}
        out["rollout_logp_gap"] = float(masked_mean((old_logp - batch.old_logp).abs(), batch.mask))
        # how well the critic foresaw this batch's returns (before learning from it), over the whole batch: a
        # minibatch of one task's episodes has returns of no variance
        out["explained_variance"] = explained_variance(old_values, returns, batch.mask)
        out["actor_skipped_uniform_rewards"] = float(skipped)
        out["tokens"] = float(batch.mask.sum())
        return out

    def sft_update(self, ids: torch.Tensor, attention: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
        """One AdamW step of the actor on the tokens where `mask` [B, L-1] is 1 (their token-mean negative
        log-likelihood): rejection-sampling fine-tuning (the rft stage). Counts as a step like `update`."""
        self.actor.train()
        with self.autocast():
            logp, _ = self.actor.logprobs(ids, attention)
        loss = -masked_mean(logp, mask)
        self.actor_optim.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.actor.parameters(), self.config.max_grad_norm)
        self.updating = True
        self.actor_optim.step()
        self.actor.eval()
        self.step += 1
        self.updating = False
        return {"sft_loss": float(loss.detach()), "actor_grad_norm": float(norm), "tokens": float(mask.sum())}

    # ---- checkpoints ------------------------------------------------------------------------------------
    def save(self, folder: Path, tokenizer=None, extra: dict | None = None, *, optimizer: bool) -> Path:
        """Actor (an HF folder, tokenizer included), critic, step, RNG and (`optimizer`) the optimizers' state,
        replaced atomically. Returns the folder."""
        folder = Path(folder)
        staging = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        self.actor.save(staging / "actor", self.base)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging / "actor")
            if self.actor.lora is not None:
                tokenizer.save_pretrained(staging / "actor" / "adapter")
        self.critic.save(staging / "critic", self.critic_base)
        state = {"step": self.step, "torch_rng": torch.get_rng_state(), "extra": extra or {},
                 "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}
        if optimizer:
            state.update(actor_optim=self.actor_optim.state_dict(), critic_optim=self.critic_optim.state_dict())
        torch.save(state, staging / "trainer.pt")
        old = folder.with_name(folder.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if folder.exists():
            folder.rename(old)
        staging.rename(folder)
        shutil.rmtree(old, ignore_errors=True)
        return folder

    def restore(self, folder: Path, log: Callable[[str], None] = print) -> dict:
        """Step, RNG and the optimizers' state (fresh ones when the checkpoint has none) from a checkpoint whose
        actor and critic this trainer was built from. Read onto the CPU: the RNG states (torch's, CUDA's, the stage's
        own generators in `extra`) must stay there; the optimizers move their state to their parameters' device."""
        state = torch.load(Path(folder) / "trainer.pt", map_location="cpu", weights_only=False)
        if "actor_optim" in state:
            self.actor_optim.load_state_dict(state["actor_optim"])
            self.critic_optim.load_state_dict(state["critic_optim"])
        else:
            log(f"{folder} holds no optimizer state (saved without --save-optimizer): the optimizers start afresh")
        torch.set_rng_state(state["torch_rng"])
        if state.get("cuda_rng") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        self.step = state["step"]
        return state["extra"]


class MetricsLog:
    """One JSON line per step in `metrics.jsonl` (and TensorBoard scalars when the package is installed). On
    resume, lines of steps after the checkpoint are dropped, so the file always matches the model."""

    def __init__(self, out: Path, resume_step: int = 0, tensorboard: bool = True, log=print):
        self.path = Path(out) / "metrics.jsonl"
        cut_after(self.path, resume_step)
        self.writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
                self.writer = SummaryWriter(str(Path(out) / "tensorboard"), purge_step=resume_step + 1)
            except ImportError:
                log("TensorBoard logging off: the tensorboard package is not installed (metrics.jsonl has all)")
        self.started = time.monotonic()

    def write(self, step: int, metrics: dict) -> None:
        record = {"step": step, **{k: _finite(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self.writer is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self.writer.add_scalar(key, value, step)
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def cut_after(path: Path, step: int) -> None:
    """Drop the lines of a per-step JSONL file (metrics, episodes) written after `step` (a resumed checkpoint's)."""
    lines = path.read_text().splitlines() if path.exists() else []
    path.write_text("".join(line + "\n" for line in lines if line.strip() and json.loads(line)["step"] <= step))


def _finite(value):
    """NaN and infinities as null (JSON has no NaN)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value
