"""The paper's four stages as verl 0.9.1 runs (the `train` extra): for each, the data it reads, the configuration
composed from verl's own config files with the recipe's overrides and validated by verl's own code, and the
command that launches it.

| stage | verl entry point | what the recipe sets |
|---|---|---|
| warmup | `verl.trainer.main_ppo` | verl's `single_turn_agent`; reward `verl_reward.compute_score` (the judge) |
| rft | `verl.trainer.sft_trainer` | the kept trajectories (`rft.export`) as multi-turn SFT data |
| value | `verl.trainer.main_ppo` | the `cuda_agent` agent loop; `trainer.critic_warmup` = all steps: critic only |
| agentic | `verl.trainer.main_ppo` | the `cuda_agent` agent loop (`verl_loop.py`) |

Every PPO stage: GAE with a critic (gamma 1; lambda and the value clip are `PPOConfig`'s, as on the local path:
verl has one lambda, the actor's, for both), clip 0.2 low / 0.28 high, token-mean loss, no KL, actor lr 3e-6,
critic lr 6e-6, the paper's batch of 1024 tasks and 150 steps unless told otherwise. The value stage's critic is
unclipped; the agentic stage's critic is `critic` (the value stage's, merged to an HF folder), else the model.
Prompts longer than `max_prompt` are filtered out of the data (measured as the model sees them).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from .config import STAGES, PPOConfig, TrainConfig

UNCLIPPED = 1e6  # a value clip no return in [-1, 3] reaches: verl's critic has no switch to turn it off


@dataclass
class Recipe:
    stage: str
    model: Path
    out: Path
    backend: str = "cuda"
    judge: str = "local"  # or "ray": judge actors on the Ray cluster's GPUs outside the training pool
    nodes: int = 1
    gpus_per_node: int = 8
    steps: int = 150
    batch: int = 1024
    max_turns: int = 200
    max_prompt: int = 8192
    max_response: int = 122880  # prompt + response = the paper's 128k context
    critic: Path | None = None  # the critic's HF folder (the value stage's); None: the model's own backbone

    def __post_init__(self):
        if self.stage not in STAGES:
            raise ValueError(f"unknown stage {self.stage!r} (choose from {', '.join(STAGES)})")
        if min(self.nodes, self.gpus_per_node, self.steps, self.batch, self.max_turns, self.max_prompt,
               self.max_response) < 1:
            raise ValueError("nodes, GPUs, steps, batch, turns and lengths must be >= 1")
        if self.judge not in ("local", "ray"):
            raise ValueError(f"judge must be 'local' or 'ray', not {self.judge!r}")


def ppo_overrides(r: Recipe, train_file: Path, agent_loops: Path) -> list[str]:
    single = r.stage == "warmup"
    mini = min(256, r.batch)
    ppo = PPOConfig()
    return [
        f"actor_rollout_ref.model.path={r.model}", f"critic.model.path={r.critic or r.model}",
        f"data.train_files={train_file}", f"data.val_files={train_file}", f"data.train_batch_size={r.batch}",
        f"data.max_prompt_length={r.max_prompt}", f"data.max_response_length={r.max_response}",
        "data.return_raw_chat=True", "data.filter_overlong_prompts=True",
        "algorithm.adv_estimator=gae", f"algorithm.gamma={ppo.gamma}", f"algorithm.lam={ppo.lam}",
        "algorithm.use_kl_in_reward=False",
        f"critic.cliprange_value={UNCLIPPED if r.stage == 'value' or ppo.value_clip is None else ppo.value_clip}",
        "actor_rollout_ref.actor.clip_ratio_low=0.2", "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean", "actor_rollout_ref.actor.use_kl_loss=False",
        f"actor_rollout_ref.actor.optim.lr={TrainConfig.actor_lr}", f"critic.optim.lr={TrainConfig.critic_lr}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}", f"critic.ppo_mini_batch_size={mini}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "critic.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.top_p=1.0",
        "actor_rollout_ref.rollout.top_k=-1",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agent_loops}",
        f"actor_rollout_ref.rollout.agent.default_agent_loop={'single_turn_agent' if single else 'cuda_agent'}",
        *(["reward.custom_reward_function.path=pkg://cuda_agent.rl.verl_reward",
           "reward.custom_reward_function.name=compute_score"] if single else []),
        f"trainer.total_training_steps={r.steps}", f"trainer.critic_warmup={r.steps if r.stage == 'value' else 0}",
        f"trainer.n_gpus_per_node={r.gpus_per_node}", f"trainer.nnodes={r.nodes}",
        "trainer.project_name=cuda-agent", f"trainer.experiment_name={r.stage}",
        f"trainer.default_local_dir={r.out / 'checkpoints'}", "trainer.logger=[console]", "trainer.save_freq=10",
        "trainer.test_freq=-1", "trainer.val_before_train=False",
    ]


def sft_overrides(r: Recipe, train_file: Path) -> list[str]:
    return [
        f"model.path={r.model}", f"data.train_files={train_file}", "data.val_files=null",
        f"data.train_batch_size={min(r.batch, 256)}", "data.micro_batch_size_per_gpu=1",
        f"data.max_length={r.max_prompt + r.max_response}", "data.truncation=right", "data.messages_key=messages",
        f"optim.lr={TrainConfig.actor_lr}", f"trainer.total_training_steps={r.steps}",
        f"trainer.n_gpus_per_node={r.gpus_per_node}",
        f"trainer.nnodes={r.nodes}", "trainer.project_name=cuda-agent", "trainer.experiment_name=rft",
        f"trainer.default_local_dir={r.out / 'checkpoints'}", "trainer.logger=[console]",
    ]


def compose(config_name: str, overrides: list[str]):
    """verl's config file `config_name` with `overrides`, as verl's hydra entry points compose it."""
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        return hydra_compose(config_name=config_name, overrides=overrides)


def validate_ppo(config) -> None:
    """verl's own checks, as `main_ppo` runs them before training."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))


def prepare(r: Recipe, tasks: list[Path] | None = None, runs: list[Path] | None = None) -> Path:
    """Write the stage's data, agent-loop file, composed config (`OUT/verl_<stage>.yaml`) and launch script
    (`OUT/launch.sh`); returns the script. Raises ValueError when verl rejects the configuration."""
    from omegaconf import OmegaConf

    from .verl_data import rft_rows, verl_rows, write_parquet

    r.out.mkdir(parents=True, exist_ok=True)
    name = f"verl_{r.stage}"
    if r.stage == "rft":
        rows = rft_rows(runs or [], r.out / "rft")
        if not rows:
            raise ValueError("no trajectory passes the RFT filter: nothing to fine-tune on (see OUT/rft)")
        config = compose("sft_trainer_engine", sft_overrides(r, write_parquet(rows, r.out / "data" / "rft.parquet")))
        command = (f"torchrun --nnodes={r.nodes} --nproc_per_node={r.gpus_per_node} --rdzv-backend=c10d "
                   "--rdzv-endpoint=${MASTER_ADDR:-localhost}:${MASTER_PORT:-29500} -m verl.trainer.sft_trainer")
        where = (f"run it on each of the {r.nodes} nodes with MASTER_ADDR set to the first one's address"
                 if r.nodes > 1 else "run it on the training node")
    else:
        if not tasks:
            raise ValueError(f"stage {r.stage} needs tasks")
        train = write_parquet(verl_rows(tasks, r.backend, single_turn=r.stage == "warmup", judge=r.judge),
                              r.out / "data" / "train.parquet")
        loops = r.out / "agent_loops.yaml"
        loops.write_text(OmegaConf.to_yaml([{
            "name": "cuda_agent", "_target_": "cuda_agent.rl.verl_loop.CudaAgentLoop", "backend": r.backend,
            "judge": r.judge, "max_turns": r.max_turns, "episodes_dir": str(r.out / "episodes")}]))
        config = compose("ppo_trainer", ppo_overrides(r, train, loops))
        try:
            validate_ppo(config)
        except (AssertionError, ValueError) as exc:
            raise ValueError(f"verl rejects the {r.stage} configuration: {exc}") from exc
        command = "python3 -m verl.trainer.main_ppo"
        where = ("run it on the Ray cluster's head node once every node has joined (scripts/ray_cluster.sh); "
                 "RAY_ADDRESS=auto joins that cluster" if r.nodes > 1 or r.judge == "ray" else "run it here")
    (r.out / f"{name}.yaml").write_text(OmegaConf.to_yaml(config))
    (r.out / "recipe.json").write_text(json.dumps({k: str(v) for k, v in vars(r).items()}, indent=2))
    script = r.out / "launch.sh"
    join = "export RAY_ADDRESS=${RAY_ADDRESS:-auto}\n" if r.stage != "rft" and (r.nodes > 1 or r.judge == "ray") else ""
    script.write_text(f"#!/usr/bin/env bash\n# written by `cuda-agent train verl`: {where}\nset -euo pipefail\n{join}"
                      f"exec {command} --config-path {shlex.quote(str(r.out.resolve()))} --config-name {name} \"$@\"\n")
    script.chmod(0o755)
    return script
