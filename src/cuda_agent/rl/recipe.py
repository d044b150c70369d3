"""The whole recipe in miniature (`cuda-agent train recipe`, issue 32): the expert's episodes on the train tasks ->
SFT on them -> RFT on the model's own positive episodes mixed with the expert's -> value pretraining (then the
critic's explained variance on the RFT model's held-out episodes, which it never trained on) -> PPO on the train
tasks, the held-out set evaluated after each model stage with the same seeds. Here the SFT data comes from
the expert (a program); the paper's RFT data came from its own warmed-up model.

An arm changes one thing (`ARMS`): `paper` lambda 0.95 for actor and critic, `no_value` no value pretraining,
`speedup` the raw-speedup reward, `no_rft` PPO from the base model (no SFT, no RFT), `single_turn` the warm-up's
one-reply loop instead of the agent loop. The controls (controls.py) run after PPO. Every step writes its own
folder under `out` and `done.json` when it ends; a rerun skips the steps that have one (and the stages resume from
their checkpoints). With a time limit the recipe stops at the first step boundary past it (a stage after the
training step that passes it, an evaluation after its batch of episodes) and `recipe.json` says where: the same
command continues.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from ..judge.pool import JudgePool
from . import checkpoints, rft
from .config import EvalConfig, PPOConfig, StageConfig
from .controls import CONTROLS, best_of, expert_records, samples_per_task
from .critic_check import critic_explained_variance
from .evaluation import evaluate, local_player
from .expert.episodes import SHAPES, play_expert
from .scores import EpisodeRecord, paired_difference, summary
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
    sft_lr: float | None = None  # the supervised stages' (SFT, RFT, filter-and-fine-tune) learning rate; None: actor_lr
    # episodes and their limits: a turn long enough for the expert's (its first, every file written, was up to 3,658
    # SmolLM2 tokens on docs/data/expert_tasks_h200; with the register kernels its files alone are 3,186 at the
    # median of the rows tasks, 4,027 at p95, 4,353 at most), else SFT teaches replies that are cut mid-call
    stage: StageConfig = field(default_factory=lambda: StageConfig(batch=16, compact=True, max_new_tokens=4096))
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(compact=True, max_new_tokens=4096))
    controls: tuple[str, ...] = CONTROLS
    time_limit_s: float | None = None  # the whole recipe's; then it stops at a step boundary (rerun continues)

    def __post_init__(self):
        if self.arm not in ARMS:
            raise ValueError(f"unknown arm {self.arm!r} (choose from {', '.join(ARMS)})")
        unknown = set(self.controls) - set(CONTROLS)
        if unknown:
            raise ValueError(f"unknown control {sorted(unknown)[0]!r} (choose from {', '.join(CONTROLS)})")

    def stage_config(self, stage: str, steps: int, batch: int | None = None) -> StageConfig:
        """The arm's settings for one stage."""
        ppo = PPOConfig(lam=0.95, critic_lam=0.95) if self.arm == "paper" else self.stage.train.ppo
        train = replace(self.stage.train, ppo=ppo)
        save_every = self.stage.save_every
        if stage == "rft":  # supervised: steps of about a second, checkpoints (the whole model) of several
            train = replace(train, actor_lr=self.sft_lr if self.sft_lr is not None else train.actor_lr)
            save_every = max(save_every, steps // 4)
        return replace(self.stage, stage=stage, steps=steps, seed=self.seed, batch=batch or self.stage.batch,
                       reward="speedup" if self.arm == "speedup" else self.stage.reward, train=train,
                       save_every=save_every)


class Recipe:
    def __init__(self, config: RecipeConfig, base: Path, train: list[Path], held_out: list[Path], out: Path,
                 pool: JudgePool, device: str, log: Callable[[str], None] = print,
                 clock: Callable[[], float] = time.monotonic):
        self.config, self.base, self.train, self.held_out = config, Path(base), train, held_out
        self.out, self.pool, self.device, self.log = Path(out), pool, device, log
        self.evals: dict[str, list[EpisodeRecord]] = {}
        self.notes: dict[str, str] = {}  # what a control could not do
        self.clock = clock
        self.deadline = clock() + (config.time_limit_s if config.time_limit_s is not None else math.inf)

    def _out_of_time(self) -> bool:
        return self.clock() > self.deadline

    def _left(self, name: str) -> float:
        """Seconds left for step `name`; TimeoutError when none are."""
        left = self.deadline - self.clock()
        if left <= 0:
            raise TimeoutError(f"time limit reached before {name}")
        return left

    def _step(self, name: str, run: Callable[[Path], dict]) -> dict:
        folder = self.out / name
        done = folder / "done.json"
        if done.is_file():
            self.log(f"recipe: {name} done before")
            return json.loads(done.read_text())
        self._left(name)
        self.log(f"recipe: {name}")
        result = run(folder)
        folder.mkdir(parents=True, exist_ok=True)
        done.write_text(json.dumps(result, indent=2, default=str))
        return result

    def _evaluate(self, name: str, model: Path, samples: int | None = None) -> dict:
        config = replace(self.config.eval, seed=self.config.seed, samples=samples or self.config.eval.samples)

        def run(folder: Path) -> dict:
            player = local_player(model, config, self.pool, self.device, log=self.log, out_of_time=self._out_of_time)
            return evaluate(self.held_out, folder, config, player, {"model": str(model), "stage": name}, self.log,
                            self._out_of_time)["summary"]
        summary = self._step(f"eval_{name}", run)
        self.evals[name] = [EpisodeRecord(**json.loads(line)) for line in
                            (self.out / f"eval_{name}" / "episodes.jsonl").read_text().splitlines()]
        return summary

    def _stage(self, name: str, config: StageConfig, model: Path, runs: list[Path] | None = None) -> Path:
        def run(folder: Path) -> dict:
            timed = replace(config, time_limit_s=self._left(name))
            history = run_stage(timed, model, self.train, folder, self.pool if config.stage != "rft" else None,
                                self.device, runs, self.log)
            reached = checkpoints.step_of(checkpoints.latest(folder))
            if reached < config.steps:  # stopped by the time limit, checkpointed: not done
                raise TimeoutError(f"time limit reached in {name} after step {reached} of {config.steps}")
            return {"last": history[-1] if history else None, "steps": config.steps}
        self._step(name, run)
        return self.out / name / "checkpoint" / "actor"

    def run(self) -> dict:
        """The arm's steps, then the controls; `recipe.json` (also when the time limit stops it: `stopped` says
        where, and the rerun continues)."""
        heldout: dict = {}
        try:
            result = self._run(heldout)
        except TimeoutError as exc:
            self.log(f"recipe: {exc}: the same command continues")
            result = {"arm": self.config.arm, "seed": self.config.seed, "stopped": str(exc), "heldout": heldout,
                      "config": asdict(self.config)}
        (self.out / "recipe.json").write_text(json.dumps(result, indent=2, default=str))
        return result

    def _run(self, heldout: dict) -> dict:
        cfg, arm = self.config, self.config.arm
        heldout["base"] = self._evaluate("base", self.base)
        model = self.base
        if arm != "no_rft":
            expert = self._step("expert", lambda folder: {"episodes": [asdict(e) for e in play_expert(
                self.pool, self.train, folder, cfg.expert_shapes, parallel=self.pool.workers, log=self.log,
                compact=cfg.stage.compact, out_of_time=self._out_of_time)[0]]})
            expert_runs = [Path(e["run_dir"]) for e in expert["episodes"]]
            model = self._stage("sft", cfg.stage_config("rft", cfg.sft_steps, cfg.sft_batch), model, expert_runs)
            heldout["sft"] = self._evaluate("sft", model)
            samples = self._step("rft_samples", lambda folder: {"runs": self._sample(model, folder, cfg.rft_samples,
                                                                                     1)})
            model = self._stage("rft", cfg.stage_config("rft", cfg.rft_steps, cfg.sft_batch), model,
                                expert_runs + [Path(r) for r in samples["runs"]])
            heldout["rft"] = self._evaluate("rft", model)
        critic = None
        if arm != "no_value":
            model = self._stage("value", cfg.stage_config("value", cfg.value_steps), model)
            held = self.evals["rft" if "rft" in self.evals else "base"]  # the value stage's policy's held-out episodes
            critic = self._step("value_check", lambda folder: critic_explained_variance(
                model.parent, [Path(r.run_dir) for r in held], cfg.stage.compact, self.device))
        start = model  # what PPO starts from: the controls start there too
        ppo_stage = "warmup" if arm == "single_turn" else "agentic"
        model = self._stage("ppo", cfg.stage_config(ppo_stage, cfg.ppo_steps), model)
        heldout["ppo"] = self._evaluate("ppo", model)
        controls = self._controls(start)
        before = "sft" if "sft" in self.evals else "base"
        boot = cfg.eval.bootstrap
        differences = {f"ppo_vs_{name}": {metric: paired_difference(self.evals["ppo"], records, metric, boot, cfg.seed)
                                          for metric in ("mean_reward", "pass_rate")}
                       for name, records in [(before, self.evals[before]), *controls.items()]}
        return {"arm": arm, "seed": cfg.seed, "heldout": heldout, "critic_on_heldout": critic, **differences,
                "controls": {name: summary(records, boot, cfg.seed) for name, records in controls.items()},
                "notes": self.notes, "config": asdict(cfg)}

    def _controls(self, start: Path) -> dict[str, list[EpisodeRecord]]:
        """Each control's held-out records (one per task for the best-of rows); controls.py says what each is."""
        cfg, out = self.config, {}
        k = samples_per_task(cfg.ppo_steps, cfg.stage.batch, len(self.train))
        if "best_of_k" in cfg.controls:
            self._evaluate(f"best_of_{k}", start, samples=k)
            out["best_of_k"] = best_of(self.evals[f"best_of_{k}"])
        if "filter_finetune" in cfg.controls:
            samples = self._step("fft_samples", lambda folder: {"runs": self._sample(start, folder, k, 2),
                                                                "kept": rft.export(
                                                                    [Path(r) for r in self._runs(folder)],
                                                                    folder / "rft", rft.RFTFilter())["kept"]})
            tuned = start
            if samples["kept"]:
                tuned = self._stage("fft", cfg.stage_config("rft", cfg.rft_steps, cfg.sft_batch), start,
                                    [Path(r) for r in samples["runs"]])
            else:  # no episode of its own passes the filter: nothing to fine-tune on
                self.notes["filter_finetune"] = (f"none of its {len(samples['runs'])} episodes passes the RFT "
                                                 "filter: its row is the start model's")
                self.log(f"recipe: filter-and-fine-tune: {self.notes['filter_finetune']}")
            self._evaluate("fft", tuned)
            out["filter_finetune"] = self.evals["fft"]
        if "expert" in cfg.controls:
            rows = self._step("expert_heldout", lambda folder: {name: [asdict(r) for r in records] for name, records
                                                                in expert_records(self.pool, self.held_out, folder,
                                                                                  cfg.seed).items()})
            out.update({name: [EpisodeRecord(**r) for r in records] for name, records in rows.items()})
        return out

    def _sample(self, model: Path, folder: Path, samples: int, offset: int) -> list[str]:
        """The model's own episodes on the train tasks (RFT's candidates: the filter keeps the positive ones)."""
        config = replace(self.config.eval, samples=samples, seed=self.config.seed + offset)
        evaluate(self.train, folder, config, local_player(model, config, self.pool, self.device, log=self.log,
                                                          out_of_time=self._out_of_time),
                 {"model": str(model), "stage": folder.name}, self.log, self._out_of_time)
        return self._runs(folder)

    @staticmethod
    def _runs(folder: Path) -> list[str]:
        return [json.loads(line)["run_dir"] for line in (folder / "episodes.jsonl").read_text().splitlines()]
