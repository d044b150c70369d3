"""The whole recipe in miniature (`cuda-agent train recipe`, issue 32): the expert's episodes on the train tasks ->
SFT on them -> RFT on the model's own positive episodes mixed with the expert's -> value pretraining (then the
critic's explained variance on the RFT model's held-out episodes, which it never trained on) -> PPO on the train
tasks, the held-out set evaluated after each model stage with the same seeds. Here the SFT data comes from
the expert (a program); the paper's RFT data came from its own warmed-up model.

An arm changes one thing (`ARMS`): `paper` lambda 0.95 for actor and critic, `no_value` no value pretraining,
`speedup` the raw-speedup reward, `no_rft` PPO from the base model (no SFT, no RFT), `single_turn` the warm-up's
one-reply loop instead of the agent loop. Every step writes its own folder under `out` and `done.json` when it
ends; a rerun skips the steps that have one (and the stages resume from their checkpoints).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from ..judge.pool import JudgePool
from .config import EvalConfig, PPOConfig, StageConfig
from .critic_check import critic_explained_variance
from .evaluation import evaluate, local_player
from .expert.episodes import SHAPES, play_expert
from .scores import EpisodeRecord, paired_difference
from .stages import run_stage

ARMS = ("full", "paper", "no_value", "speedup", "no_rft", "single_turn")


@dataclass
class RecipeConfig:
    arm: str = "full"
    seed: int = 0
    expert_shapes: tuple[str, ...] = SHAPES
    sft_steps: int = 30
    rft_samples: int = 2  # episodes of the SFT model per train task, its positives kept for RFT
    rft_steps: int = 10
    value_steps: int = 5
    ppo_steps: int = 20
    sft_batch: int = 8  # conversations per supervised step
    stage: StageConfig = field(default_factory=lambda: StageConfig(batch=16, compact=True))  # episodes, limits
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(compact=True))

    def __post_init__(self):
        if self.arm not in ARMS:
            raise ValueError(f"unknown arm {self.arm!r} (choose from {', '.join(ARMS)})")

    def stage_config(self, stage: str, steps: int, batch: int | None = None) -> StageConfig:
        """The arm's settings for one stage."""
        ppo = PPOConfig(lam=0.95, critic_lam=0.95) if self.arm == "paper" else self.stage.train.ppo
        return replace(self.stage, stage=stage, steps=steps, seed=self.seed, batch=batch or self.stage.batch,
                       reward="speedup" if self.arm == "speedup" else self.stage.reward,
                       train=replace(self.stage.train, ppo=ppo))


class Recipe:
    def __init__(self, config: RecipeConfig, base: Path, train: list[Path], held_out: list[Path], out: Path,
                 pool: JudgePool, device: str, log: Callable[[str], None] = print):
        self.config, self.base, self.train, self.held_out = config, Path(base), train, held_out
        self.out, self.pool, self.device, self.log = Path(out), pool, device, log
        self.evals: dict[str, list[EpisodeRecord]] = {}

    def _step(self, name: str, run: Callable[[Path], dict]) -> dict:
        folder = self.out / name
        done = folder / "done.json"
        if done.is_file():
            self.log(f"recipe: {name} done before")
            return json.loads(done.read_text())
        self.log(f"recipe: {name}")
        result = run(folder)
        folder.mkdir(parents=True, exist_ok=True)
        done.write_text(json.dumps(result, indent=2, default=str))
        return result

    def _evaluate(self, name: str, model: Path) -> dict:
        def run(folder: Path) -> dict:
            player = local_player(model, self.config.eval, self.pool, self.device)
            return evaluate(self.held_out, folder, replace(self.config.eval, seed=self.config.seed), player,
                            {"model": str(model), "stage": name}, self.log)["summary"]
        summary = self._step(f"eval_{name}", run)
        self.evals[name] = [EpisodeRecord(**json.loads(line)) for line in
                            (self.out / f"eval_{name}" / "episodes.jsonl").read_text().splitlines()]
        return summary

    def _stage(self, name: str, config: StageConfig, model: Path, runs: list[Path] | None = None) -> Path:
        def run(folder: Path) -> dict:
            history = run_stage(config, model, self.train, folder, self.pool if config.stage != "rft" else None,
                                self.device, runs, self.log)
            return {"last": history[-1] if history else None, "steps": config.steps}
        self._step(name, run)
        return self.out / name / "checkpoint" / "actor"

    def run(self) -> dict:
        cfg, arm = self.config, self.config.arm
        heldout = {"base": self._evaluate("base", self.base)}
        model = self.base
        if arm != "no_rft":
            expert = self._step("expert", lambda folder: {"episodes": [asdict(e) for e in play_expert(
                self.pool, self.train, folder, cfg.expert_shapes, log=self.log, compact=cfg.stage.compact)[0]]})
            expert_runs = [Path(e["run_dir"]) for e in expert["episodes"]]
            model = self._stage("sft", cfg.stage_config("rft", cfg.sft_steps, cfg.sft_batch), model, expert_runs)
            heldout["sft"] = self._evaluate("sft", model)
            samples = self._step("rft_samples", lambda folder: {"runs": self._sample(model, folder)})
            model = self._stage("rft", cfg.stage_config("rft", cfg.rft_steps, cfg.sft_batch), model,
                                expert_runs + [Path(r) for r in samples["runs"]])
            heldout["rft"] = self._evaluate("rft", model)
        critic = None
        if arm != "no_value":
            model = self._stage("value", cfg.stage_config("value", cfg.value_steps), model)
            held = self.evals["rft" if "rft" in self.evals else "base"]  # the value stage's policy's held-out episodes
            critic = self._step("value_check", lambda folder: critic_explained_variance(
                model.parent, [Path(r.run_dir) for r in held], cfg.stage.compact, self.device))
        ppo_stage = "warmup" if arm == "single_turn" else "agentic"
        model = self._stage("ppo", cfg.stage_config(ppo_stage, cfg.ppo_steps), model)
        heldout["ppo"] = self._evaluate("ppo", model)
        before = "sft" if "sft" in self.evals else "base"
        result = {"arm": arm, "seed": cfg.seed, "heldout": heldout, "critic_on_heldout": critic, "ppo_vs_" + before: {
            metric: paired_difference(self.evals["ppo"], self.evals[before], metric, cfg.eval.bootstrap, cfg.seed)
            for metric in ("mean_reward", "pass_rate")}, "config": asdict(cfg)}
        (self.out / "recipe.json").write_text(json.dumps(result, indent=2, default=str))
        return result

    def _sample(self, model: Path, folder: Path) -> list[str]:
        """The model's own episodes on the train tasks (RFT's candidates: the filter keeps the positive ones)."""
        config = replace(self.config.eval, samples=self.config.rft_samples, seed=self.config.seed + 1)
        evaluate(self.train, folder, config, local_player(model, config, self.pool, self.device),
                 {"model": str(model), "stage": "rft_samples"}, self.log)
        return [json.loads(line)["run_dir"] for line in (folder / "episodes.jsonl").read_text().splitlines()]
