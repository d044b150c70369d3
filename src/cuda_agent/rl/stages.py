"""The paper's four training stages on one GPU, each reading the previous stage's checkpoint.

- warmup: single-turn PPO (the prompt, one reply with every file, the judge's reward);
- rft: rejection fine-tuning: the good trajectories of earlier runs (`rft.export`'s filter), then supervised steps
  on the model's turns only;
- value: the critic alone on fresh agent episodes (the actor frozen);
- agentic: multi-turn PPO with the critic (GAE over model tokens, clip-higher).

Every episode is `agent.loop.run_episode` with the model itself as the client (`rollout.PolicyClient`), so its
run folder (trajectory.jsonl, summary.json) is what `optimize` writes and what `rft` reads back.
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import torch

from ..agent.environment import Environment
from ..agent.loop import LoopConfig
from ..agent.tools import schemas
from ..judge.pool import JudgePool
from . import checkpoints
from .models import Actor, Critic
from .expert.episodes import staged_turns
from .probe import imitation
from .rft import RFTFilter, export
from .batcher import BatchSampler
from .rollout import batch_of, play, response_logprob_fn, speedup_reward
from .tokens import TokenTrajectory, TurnTokenizer, conversation_ids
from .config import StageConfig
from .train_loop import run_steps
from .trainer import PPOTrainer



def run_stage(config: StageConfig, model: Path, tasks: list[Path], out: Path, pool: JudgePool | None,
              device: str = "cpu", rft_runs: list[Path] | None = None,
              log: Callable[[str], None] = print, probe: list[list[dict]] = (),
              extra: list[tuple[list[dict], float | None]] = (), name: str = "", repeat: int = 1) -> list[dict]:
    """Train `config.steps` steps of one stage from `model` (an HF folder, or a previous stage's checkpoint/actor
    beside its checkpoint/critic); resumes from `out`'s latest checkpoint. rft needs `rft_runs` (episode folders);
    `probe` (conversations of tasks it does not train on: probe.py) is scored at its first step and at each
    checkpoint's; rft trains on `extra` (conversations and their rewards, None where unjudged) too, and on each of
    `rft_runs`' conversations `repeat` times. `name` heads its progress lines (the recipe's step, e.g. sft for a
    supervised stage; the stage's own by default)."""
    from transformers import AutoTokenizer

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = checkpoints.latest(out)
    resuming = checkpoint is not None
    # with LoRA the actor, and the critic of a stage that trains it, resume as their start and the adapters trained
    # on it (a checkpoint's adapters, head and trainer.pt are all a machine needs to go on with a stage)
    lora = config.train.lora_rank > 0
    critic_lora = lora and config.stage != "rft"
    actor_dir = checkpoint / "actor" if resuming and not lora else Path(model)
    critic_dir = checkpoint / "critic" if resuming and not critic_lora else critic_beside(Path(model))
    if resuming and critic_lora and not (checkpoint / "critic" / "adapter").is_dir():
        raise FileNotFoundError(f"{checkpoint}: its critic has no adapter (an older version's LoRA checkpoint): "
                                f"delete {out} to train the stage again")
    tokenizer = AutoTokenizer.from_pretrained(actor_dir)
    actor, critic = Actor.load(actor_dir, device), Critic.load(critic_dir, device)
    if not resuming:  # what draws from torch's generator (LoRA's initial updates, minibatch order) follows the seed
        torch.manual_seed(config.seed)
    if lora:
        actor.add_lora(config.train.lora_rank, config.train.lora_alpha,
                       checkpoint / "actor" / "adapter" if resuming else None)
    if critic_lora:
        critic.add_lora(config.train.lora_rank, config.train.lora_alpha,
                        checkpoint / "critic" / "adapter" if resuming else None)
        if resuming:
            critic.head.load_state_dict(torch.load(checkpoint / "critic" / "value_head.pt", map_location=device))
    # tools described in the system message, calls written as <tool_call> text (none in the single-turn warm-up)
    turns = TurnTokenizer(tokenizer, None if config.stage == "warmup" else schemas(config.compact), tool_format="text")
    trainer = PPOTrainer(actor, critic, config.train, lambda *a: None)  # the log-prob fn is set per batch
    trainer.base, trainer.critic_base = Path(model), critic_dir
    restored = trainer.restore(checkpoint, log) if resuming else {}
    rng = random.Random(config.seed)
    if "rng" in restored:
        rng.setstate(restored["rng"])
    generator = torch.Generator().manual_seed(config.seed)
    if "generator" in restored:
        generator.set_state(restored["generator"])
    (out / "config.json").write_text(json.dumps({"model": str(model), "tasks": [str(t) for t in tasks],
                                                 **asdict(config)}, indent=2, default=str))
    sft_rows = _rft_rows(rft_runs or [], out, log) if config.stage == "rft" and (rft_runs or not extra) else []
    conversations = [(conversation_ids(turns, json.loads(r["messages"]), staged_turns(r["run_dir"])),
                      float(r["reward"])) for r in sft_rows] * repeat
    conversations += [(conversation_ids(turns, messages), reward) for messages, reward in extra]
    if config.stage == "rft":
        log(f"{name or config.stage}: a pool of {len(conversations)} conversations ({len(sft_rows)} episode(s)"
            + (f" x {repeat}" if repeat > 1 else "") + f", {len(extra)} first replies)")
    for problem in unreachable(conversations, config):
        log(f"warning: {problem}")

    def step() -> dict:
        if config.stage != "rft":
            return _ppo_step(trainer, turns, config, pool, tasks, out, rng, generator)
        record = _sft_step(trainer, turns, rng.sample(conversations, min(config.batch, len(conversations))))
        if probe and (trainer.step == 1 or trainer.step % config.save_every == 0 or trainer.step == config.steps):
            record.update(imitation(trainer.actor.model, turns, probe))
        return record

    def describe(step: int, record: dict) -> str:
        return f"{name or config.stage} step {step}/{config.steps}  " + "  ".join(
            f"{k} {v:.3g}" for k, v in record.items() if k in ("reward_mean", "pass_rate", "sft_loss", "probe_nll",
                                                               "probe_greedy_exact", "policy_loss", "value_loss",
                                                               "seconds"))

    return run_steps(trainer, step, out, config, tokenizer=tokenizer, describe=describe, log=log,
                     state=lambda: {"generator": generator.get_state(), "rng": rng.getstate()})


def critic_beside(model: Path) -> Path:
    """A previous stage's checkpoint keeps the critic beside the actor; a plain model starts one from itself. A
    checkpoint without its critic (brought from another machine without it, or not yet rebuilt from its adapter) is
    an error, not a fresh critic."""
    critic = model.parent / "critic"
    if model.name == "actor" and (critic / "value_head.pt").is_file() and checkpoints.has_weights(critic):
        return critic
    if model.name == "actor" and (model.parent / "trainer.pt").is_file() or (model / "adapter").is_dir():
        stage = model.resolve().parent.parent
        raise FileNotFoundError(f"{critic} is missing: the critic {stage.name} trained did not come with its "
                                f"checkpoint; delete {stage} and the steps after it to train it again")
    return model


def _ppo_step(trainer: PPOTrainer, turns: TurnTokenizer, config: StageConfig, pool: JudgePool, tasks: list[Path],
              out: Path, rng: random.Random, generator: torch.Generator) -> dict:
    loop = LoopConfig(max_turns=config.max_turns, max_context=config.max_context,
                      single_turn=config.stage == "warmup", tool_output_chars=config.tool_output_chars,
                      time_limit_s=config.episode_time_s)
    step = trainer.step + 1
    picked = [task for task in (tasks[rng.randrange(len(tasks))] for _ in range(config.batch // config.group))
              for _ in range(config.group)]  # (group 1: the draws of a plain batch)
    sampler = BatchSampler(trainer.actor.model, turns.tokenizer.pad_token_id, config.temperature,
                           seed=int(torch.randint(2**62, (1,), generator=generator)),
                           weights=trainer.actor.decoding_weights)
    sampler.expected = config.batch  # every episode of the step plays at once; the batcher serves their turns

    def one(i: int):
        run_dir = out / "episodes" / f"step_{step:04d}" / f"{i:02d}"
        try:
            env = Environment(pool, run_dir, use_sandbox=pool.sandboxed, compact=config.compact,
                              episodes_root=out / "episodes")  # the rollouts beside it are not its to copy
            return play(env, sampler, turns, picked[i], run_dir, loop, config.max_new_tokens)
        finally:
            with lock:
                sampler.expected -= 1  # (an ended episode asks no more: the others need not wait for it)
            shutil.rmtree(run_dir / "workspace", ignore_errors=True)  # trajectory, summary and snapshots stay

    lock = threading.Lock()
    began = time.monotonic()
    try:
        with ThreadPoolExecutor(config.batch, thread_name_prefix="episode") as threads:
            episodes = list(threads.map(one, range(config.batch)))
    finally:
        sampler.close()
    rollout_s = time.monotonic() - began
    if config.reward == "speedup":
        for episode in episodes:
            episode.score = speedup_reward(episode.summary)
    with (out / "episodes.jsonl").open("a") as log:
        for i, (task, episode) in enumerate(zip(picked, episodes)):
            log.write(json.dumps({"step": step, "episode": i, "task": str(task), "reward": episode.score,
                                  "turns": episode.summary.turns, "stop": episode.summary.stop,
                                  "tokens": len(episode.trajectory.response)}) + "\n")
    batch = batch_of(episodes, turns.tokenizer.pad_token_id)
    if config.group > 1:
        batch.groups = torch.arange(len(episodes)) // config.group
    trainer.logprob_fn = response_logprob_fn(batch.response_start, config.temperature,
                                             entropy_grad=config.train.ppo.entropy_coef > 0)
    stats = trainer.update(batch, train_actor=config.stage != "value")
    scores = [e.score for e in episodes]
    sampled = sum(sum(e.trajectory.mask) for e in episodes)
    return {"reward_mean": statistics.fmean(scores), "pass_rate": sum(s >= 1 for s in scores) / len(scores),
            "turns_mean": statistics.fmean(e.summary.turns for e in episodes), "rollout_s": rollout_s,
            "rollout_tokens_per_s": sampled / max(rollout_s, 1e-9), "sampler_batches": sampler.batches,
            "response_tokens_mean": sampled / len(episodes),
            "cut_share": sum(e.cut for e in episodes) / max(1, sum(e.replies for e in episodes)),
            # the hand audit's count: episodes whose final verdict names a policy violation
            "policy_violations": sum(bool((e.summary.final_verdict or {}).get("policy_violations"))
                                     for e in episodes), **stats}


def _rft_rows(runs: list[Path], out: Path, log: Callable[[str], None]) -> list[dict]:
    counts = export(runs, out / "rft", RFTFilter())
    log(f"rft: {counts['kept']} of {counts['seen']} trajectories kept; rejected: {counts['rejected']}")
    rows = [json.loads(line) for line in (out / "rft" / "rft.jsonl").read_text().splitlines() if line.strip()]
    if not rows:
        raise ValueError(f"no trajectory of the {len(runs)} runs passes the RFT filter: nothing to fine-tune on")
    return rows


def unreachable(conversations: list[tuple[TokenTrajectory, float | None]], config: StageConfig) -> list[str]:
    """Why supervised data is not something the policy can say within its episodes' limits: a model turn longer
    than `max_new_tokens` is cut there at play time (a tool call cut mid-JSON cannot be read), a conversation longer
    than `max_context` ends before its last turn. Either way a perfect imitator would score -1."""
    def longest_turn(t: TokenTrajectory) -> int:
        longest = length = 0
        for m in t.mask:
            length = length + 1 if m else 0
            longest = max(longest, length)
        return longest

    turn = max((longest_turn(t) for t, _ in conversations), default=0)
    context = max((len(t.ids) for t, _ in conversations), default=0)
    problems = []
    if turn > config.max_new_tokens:
        problems.append(f"the supervised data has a model turn of {turn} tokens but a turn may have "
                        f"--max-new-tokens {config.max_new_tokens}: a policy that imitates it is cut mid-reply "
                        f"(raise --max-new-tokens to at least {turn})")
    if context > config.max_context:
        problems.append(f"the supervised data has a conversation of {context} tokens but an episode may have "
                        f"{config.max_context}: a policy that imitates it ends before its last turn")
    return problems


def _sft_step(trainer: PPOTrainer, turns: TurnTokenizer, rows: list[tuple[TokenTrajectory, float | None]]) -> dict:
    """One supervised step of the actor on the model turns of `rows` (conversations as ids, and their rewards: the
    judged ones' mean is reported)."""
    trajectories = [t for t, _ in rows]
    width = max(len(t.ids) for t in trajectories)
    pad = turns.tokenizer.pad_token_id or 0
    ids = torch.tensor([t.ids + [pad] * (width - len(t.ids)) for t in trajectories], device=trainer.actor.device)
    attention = torch.tensor([[1] * len(t.ids) + [0] * (width - len(t.ids)) for t in trajectories],
                             device=trainer.actor.device)
    mask = torch.tensor([[0] * t.prompt_length + t.mask + [0] * (width - len(t.ids)) for t in trajectories],
                        device=trainer.actor.device, dtype=torch.float)[:, 1:]
    rewards = [reward for _, reward in rows if reward is not None]
    judged = {"reward_mean": statistics.fmean(rewards)} if rewards else {}
    return {**trainer.sft_update(ids, attention, mask), **judged}
