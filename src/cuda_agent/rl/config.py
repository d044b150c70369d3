"""What each training run is told: one dataclass per concern, every default stated here once (the command line
reads its defaults from these). Light to import: no torch."""

from __future__ import annotations

from dataclasses import dataclass, field

STAGES = ("warmup", "rft", "value", "agentic")
REWARDS = ("milestone", "speedup")


@dataclass
class PPOConfig:
    """The PPO update: GAE, the clipped objectives, their coefficients (algorithm.py). The paper's lambda is 0.95
    for both; here the actor's and the critic's are apart and 1 by default: with an outcome reward, token t gets
    lambda^(model tokens to the end) of it, 0.95^1300 ~ 1e-29 at the end of a turn that writes a kernel."""

    gamma: float = 1.0
    lam: float = 1.0  # the actor's GAE lambda (advantages)
    critic_lam: float = 1.0  # the critic's (its targets: 1 is the episode's return itself)
    clip_low: float = 0.2  # ratio >= 1 - clip_low ...
    clip_high: float = 0.28  # ... and <= 1 + clip_high ("clip-higher": room for rare tokens to gain mass)
    value_clip: float | None = 0.5  # the critic's new value stays within this of the rollout's (verl's); None: off
    kl_coef: float = 0.0  # KL to the reference policy, in the loss (k3 estimator); 0: off
    entropy_coef: float = 0.0
    whiten_advantages: bool = True
    skip_uniform: bool = True  # a batch whose episodes all scored the same trains the critic only (below)
    tis_cap: float | None = None  # truncated importance sampling (sampler vs trainer log-probs), capped here; None: off

    def __post_init__(self):
        for name in ("gamma", "lam", "critic_lam"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1]")
        if self.tis_cap is not None and self.tis_cap < 1.0:
            raise ValueError("tis_cap must be >= 1 (it truncates weights above it), or None")


@dataclass
class TrainConfig:
    """One optimisation step of actor and critic (trainer.py)."""

    actor_lr: float = 3e-6  # the paper's
    critic_lr: float = 6e-6  # the critic's backbone (the paper's)
    value_head_lr: float = 1e-3  # its value head, which starts at zero: Adam moves each weight about lr an update,
    # and SmolLM2's last hidden state has |h| ~1 in each of 576 dimensions, so 12 updates at 1e-4 (the ninth
    # attempt's value pretraining) moved a value by at most ~0.4: that critic ended between 0 and the mean return
    epochs: int = 2  # passes over each batch
    minibatches: int = 2  # optimizer steps per pass
    max_grad_norm: float = 1.0
    gradient_checkpointing: bool = True  # recompute each layer's activations in backward: memory for time
    bf16: bool | None = None  # bf16 autocast over fp32 weights; None: on CUDA only
    lora_rank: int = 0  # > 0: the actor, and a critic that trains, train LoRA updates of this rank only (lora.py)
    # (and the critic its head); 0: every weight
    lora_alpha: float = 16.0  # their scale is lora_alpha / lora_rank
    ppo: PPOConfig = None  # type: ignore[assignment]

    def __post_init__(self):
        if self.ppo is None:
            self.ppo = PPOConfig()
        for name in ("actor_lr", "critic_lr", "value_head_lr"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0")
        if self.epochs < 1 or self.minibatches < 1:
            raise ValueError("epochs and minibatches must be >= 1")
        if self.lora_rank < 0:
            raise ValueError("lora_rank must be >= 0 (0: no LoRA)")


@dataclass
class RunConfig:
    """What every training run shares (train_loop.py): how many steps of how large a batch, its seed and sampling
    temperature, how often it checkpoints, how many checkpoints it keeps and whether they hold the optimizers' state
    (AdamW's two moments: twice the weights' size; a resume without them starts the optimizers afresh), and when it
    stops early (after the step that passes `time_limit_s`)."""

    steps: int = 10
    batch: int = 4
    seed: int = 0
    temperature: float = 1.0
    save_every: int = 5
    keep_checkpoints: int = 1  # the newest N (checkpoints.py)
    save_optimizer: bool = False
    time_limit_s: float | None = None
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self):
        if min(self.steps, self.batch, self.save_every, self.keep_checkpoints) < 1:
            raise ValueError("steps, batch, save_every and keep_checkpoints must be >= 1")


@dataclass
class DemoConfig(RunConfig):
    """The learning demo (demo.py): a reply picks a kernel, each pick judged."""

    steps: int = 40
    batch: int = 32
    backend: str = "cuda"
    keep_episodes: bool = False  # keep each judged episode's folder (snapshots, verdicts)

    def __post_init__(self):
        super().__post_init__()
        if self.batch < 2:
            raise ValueError("batch must be >= 2 (advantages compare the picks of one step)")


@dataclass
class StageConfig(RunConfig):
    """One of the paper's stages on one GPU (stages.py); `batch` counts episodes (rft: conversations) per step."""

    stage: str = "agentic"
    max_turns: int = 20
    max_new_tokens: int = 1024  # per model turn
    max_context: int = 8192  # tokens of an episode
    tool_output_chars: int = 4000  # each tool result cut to this (~1,200 SmolLM2 tokens; 12,000 filled half of 8k)
    episode_time_s: float = 1800.0  # an episode's wall clock (LoopConfig.time_limit_s): a step waits for its last
    compact: bool = False  # the compact tool set, SKILL.md left in the workspace (agent/tools.py)
    reward: str = "milestone"  # or "speedup": the paper's ablation (rollout.speedup_reward)
    group: int = 1  # episodes of one task in a PPO / value step (batch / group tasks); > 1: an episode's advantage is
    # its return less its group's mean (the critic still learns, but is not the actor's baseline)

    def __post_init__(self):
        super().__post_init__()
        if self.reward not in REWARDS:
            raise ValueError(f"unknown reward {self.reward!r} (choose from {', '.join(REWARDS)})")
        if self.stage not in STAGES:
            raise ValueError(f"unknown stage {self.stage!r} (choose from {', '.join(STAGES)})")
        if self.max_turns < 1 or self.max_new_tokens < 1 or self.tool_output_chars < 100 or self.episode_time_s <= 0:
            raise ValueError("max_turns and max_new_tokens must be >= 1, tool_output_chars >= 100, episode_time_s > 0")
        if self.group < 1 or self.batch % self.group:
            raise ValueError(f"group {self.group}: episodes of one task, >= 1 and dividing the batch ({self.batch})")
        if self.group > 1 and self.train.ppo.gamma != 1.0:
            raise ValueError("a group baseline compares episodes' outcomes: it needs gamma 1")


@dataclass
class EvalConfig:
    """A held-out evaluation (evaluation.py): `samples` episodes per task of a model (a checkpoint, or an endpoint),
    with the stages' episode limits; `batch` episodes play at once with a local model."""

    samples: int = 4
    seed: int = 0
    temperature: float = RunConfig.temperature
    batch: int = 32
    max_turns: int = StageConfig.max_turns
    max_new_tokens: int = StageConfig.max_new_tokens
    max_context: int = StageConfig.max_context
    tool_output_chars: int = StageConfig.tool_output_chars
    compact: bool = StageConfig.compact
    episode_time_s: float = StageConfig.episode_time_s
    bootstrap: int = 2000  # resamples of the tasks for the confidence intervals

    def __post_init__(self):
        if min(self.samples, self.batch, self.max_turns, self.max_new_tokens, self.bootstrap) < 1:
            raise ValueError("samples, batch, max_turns, max_new_tokens and bootstrap must be >= 1")
        if self.episode_time_s <= 0:
            raise ValueError("episode_time_s must be > 0")
