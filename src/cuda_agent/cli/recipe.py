"""`train recipe`: the paper's recipe in miniature on one GPU, with its ablations as arms (rl/recipe.py)."""

from __future__ import annotations

import faulthandler
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from ..backend import BackendError
from ..rl.controls import CONTROLS
from ..rl.recipe import ARMS, RecipeConfig
from ..task import TaskError, task_files
from . import common
from .common import err, fail, integers, out, warn_unsandboxed, writable
from .options import BACKEND_HELP, Backends
from .train import ActorLr, CriticLr, Group, LoraAlpha, LoraRank, train_app

DEFAULTS = RecipeConfig()
STACKS_AFTER_S = 30  # past --time-limit, the recipe's threads' stacks are logged (it should have stopped)


@train_app.command("recipe")
def train_recipe_cmd(
    data: Path = typer.Option(..., help="train tasks (e.g. a `data build --family expert` export's "
                              "splits/train.jsonl)"),
    held_out: Path = typer.Option(..., "--held-out", help="held-out tasks (e.g. splits/held_out.jsonl)"),
    validation: Optional[Path] = typer.Option(
        None, help="tasks neither trained on nor held out (e.g. train-split rows past --data's): SFT and RFT score "
        "how closely the model writes the expert's first reply on them, teacher-forced (metrics.jsonl's probe_*)"),
    out_dir: Path = typer.Option(..., "--out", help="run folder: one folder per step (rerun to resume), "
                                 "recipe.json"),
    model: Optional[Path] = typer.Option(None, help="an HF causal-LM folder (default: the packaged "
                                         "SmolLM2-135M-Instruct)"),
    arm: str = typer.Option(DEFAULTS.arm, help=f"what changes: {', '.join(ARMS)}"),
    backend: Backends = typer.Option("cuda", help=BACKEND_HELP),
    seed: int = typer.Option(DEFAULTS.seed, help="the seed of every stage and evaluation"),
    sft_steps: int = typer.Option(DEFAULTS.sft_steps, min=1, help="SFT steps on the expert's episodes"),
    rft_samples: int = typer.Option(DEFAULTS.rft_samples, min=1, help="episodes per train task sampled for RFT"),
    rft_steps: int = typer.Option(DEFAULTS.rft_steps, min=1, help="RFT steps"),
    value_steps: int = typer.Option(DEFAULTS.value_steps, min=1, help="value pretraining steps"),
    value_epochs: int = typer.Option(DEFAULTS.value_epochs, min=1, help="passes over each value pretraining batch"),
    ppo_steps: int = typer.Option(DEFAULTS.ppo_steps, min=1, help="PPO steps"),
    epochs: int = typer.Option(DEFAULTS.stage.train.epochs, min=1, help="passes over each PPO batch (value "
                               "pretraining's: --value-epochs)"),
    minibatches: int = typer.Option(DEFAULTS.stage.train.minibatches, min=1, help="optimizer steps per pass"),
    batch: int = typer.Option(DEFAULTS.stage.batch, min=1, help="episodes per PPO / value step"),
    group: Group = DEFAULTS.stage.group,
    samples: int = typer.Option(DEFAULTS.eval.samples, min=1, help="held-out episodes per task at each evaluation"),
    max_turns: int = typer.Option(DEFAULTS.stage.max_turns, min=1, help="model turns per episode"),
    max_new_tokens: int = typer.Option(DEFAULTS.stage.max_new_tokens, min=1, help="tokens per model turn"),
    temperature: float = typer.Option(DEFAULTS.stage.temperature, min=0.01, help="sampling temperature of every "
                                      "episode (rollouts, held-out evaluations, controls)"),
    rollout_temperature: Optional[float] = typer.Option(
        DEFAULTS.rollout_temperature, min=0.01, help="value pretraining's and PPO's sampling temperature (default: "
        "--temperature; the evaluations, RFT's samples and the controls keep --temperature)"),
    shapes: str = typer.Option(",".join(DEFAULTS.expert_shapes), help="the expert's episode shapes"),
    sft_shapes: str = typer.Option(",".join(DEFAULTS.sft_shapes), help="the expert's shapes SFT and RFT train on "
                                   "(e.g. direct: one reply a prompt; default: every shape it played)"),
    sft_repeat: int = typer.Option(DEFAULTS.sft_repeat, min=1, help="with --sft-corpus: SFT's judged episodes "
                                   "(whole conversations, e.g. a failed verdict repaired) counted this many times "
                                   "beside the corpus's first replies"),
    sft_corpus: int = typer.Option(DEFAULTS.sft_corpus, min=0, help="tasks composed beyond --data whose expert "
                                   "first replies SFT trains on too (unjudged; no held-out or validation task's "
                                   "operator set; 0: none)"),
    actor_lr: ActorLr = DEFAULTS.stage.train.actor_lr,
    critic_lr: CriticLr = DEFAULTS.stage.train.critic_lr,
    value_head_lr: float = typer.Option(DEFAULTS.stage.train.value_head_lr, min=0, help="the critic's value head's "
                                        "learning rate (value pretraining and PPO)"),
    sft_lr: Optional[float] = typer.Option(DEFAULTS.sft_lr, min=0, help="learning rate of the supervised stages (SFT, "
                                           "RFT, filter-and-fine-tune; default: --actor-lr)"),
    lora_rank: LoraRank = DEFAULTS.stage.train.lora_rank,
    lora_alpha: LoraAlpha = DEFAULTS.stage.train.lora_alpha,
    sft_lora_rank: Optional[int] = typer.Option(
        DEFAULTS.sft_lora_rank, min=0, help="SFT's LoRA rank (default: --lora-rank); 0 with --lora-rank > 0: SFT "
        "trains every weight and the later stages adapters on it, which travel (a machine without SFT's weights "
        "trains it again from its seed)"),
    controls: str = typer.Option(",".join(DEFAULTS.controls), help=f"controls after PPO, of {', '.join(CONTROLS)} "
                                 "(comma-separated; '' for none)"),
    reuse: list[Path] = typer.Option(
        [], exists=True, file_okay=False, help="another run folder (e.g. another arm of this seed): its steps "
        "done with the same inputs and settings are linked, not run again (repeatable)"),
    time_limit: Optional[float] = typer.Option(None, min=1, help="seconds for the whole recipe; then it stops at a "
                                               "step boundary and the same command continues"),
    device: Optional[str] = typer.Option(None, help="where the model trains (default: cuda with --backend cuda)"),
    gpus: Optional[str] = typer.Option(None, help="judge GPUs, e.g. 0,1"),
    cache_dir: Optional[Path] = typer.Option(None, help="judge cache (builds, baselines)"),
) -> None:
    """Expert episodes -> SFT -> RFT -> value pretraining -> PPO, the held-out set evaluated after each stage."""
    from ..judge.pool import JudgePool
    from ..rl.recipe import Recipe

    writable(out_dir, "--out")
    writable(cache_dir, "--cache-dir")
    device = device or ("cuda" if backend == "cuda" else "cpu")
    try:
        if backend == "cuda" or device.startswith("cuda"):
            from ..backend import detect_cuda_arch

            detect_cuda_arch()  # no GPU: say so before fetching or loading a model
        if model is None:
            from ..local_model import fetch

            model = fetch(log=lambda m: err.print(m, highlight=False, soft_wrap=True))
        if not (model / "config.json").is_file():
            fail(f"{model} is not an HF model folder (no config.json)")
        limits = dict(max_turns=max_turns, max_new_tokens=max_new_tokens, temperature=temperature)
        config = RecipeConfig(arm=arm, seed=seed, expert_shapes=tuple(s.strip() for s in shapes.split(",")),
                              sft_shapes=tuple(s.strip() for s in sft_shapes.split(",") if s.strip()),
                              sft_corpus=sft_corpus, sft_repeat=sft_repeat, sft_steps=sft_steps, sft_lr=sft_lr,
                              sft_lora_rank=sft_lora_rank, rft_samples=rft_samples,
                              rft_steps=rft_steps, value_steps=value_steps, value_epochs=value_epochs,
                              ppo_steps=ppo_steps, rollout_temperature=rollout_temperature,
                              time_limit_s=time_limit,
                              controls=tuple(c.strip() for c in controls.split(",") if c.strip()),
                              stage=replace(DEFAULTS.stage, batch=batch, group=group, **limits, train=replace(
                                  DEFAULTS.stage.train, actor_lr=actor_lr, critic_lr=critic_lr,
                                  value_head_lr=value_head_lr, lora_rank=lora_rank, lora_alpha=lora_alpha,
                                  epochs=epochs, minibatches=minibatches)),
                              eval=replace(DEFAULTS.eval, samples=samples, **limits))
        train, held = task_files(data, out_dir / "tasks" / "train"), task_files(held_out, out_dir / "tasks" / "held")
        checked = task_files(validation, out_dir / "tasks" / "validation") if validation else []
        began = time.monotonic()

        def log(message: str) -> None:  # (each line with the seconds since the start: against --time-limit)
            err.print(f"[{time.monotonic() - began:6.0f} s] {message}", highlight=False, soft_wrap=True)
        if time_limit is not None:  # still running well past its limit: every thread's stack, to see what holds it
            faulthandler.dump_traceback_later(time_limit + STACKS_AFTER_S, file=sys.__stderr__)
        try:
            with JudgePool(backend, common.config(cache_dir), devices=integers(gpus, "--gpus")) as pool:
                warn_unsandboxed(pool)
                result = Recipe(config, model, train, held, out_dir, pool, device, log, reuse=reuse,
                                validation=checked).run()
        finally:
            faulthandler.cancel_dump_traceback_later()
    except (TaskError, BackendError, ValueError) as exc:
        fail(str(exc))
    except FileNotFoundError as exc:  # a step brought from another machine without weights it needs
        fail(str(exc))
    except OSError as exc:
        fail(f"model {model}: {exc}")
    if "stopped" in result:
        out.print(f"{result['stopped']}: rerun the same command to continue ({out_dir / 'recipe.json'})",
                  highlight=False, soft_wrap=True)
        return
    rows = [f"{stage}: mean reward {row['mean_reward']:+.2f} {row['mean_reward_ci']}, pass rate "
            f"{row['pass_rate']:.2f}" for stage, row in result["heldout"].items()]
    rows += [f"{name} (control): mean reward {row['mean_reward']:+.2f} {row['mean_reward_ci']}, pass rate "
             f"{row['pass_rate']:.2f}" for name, row in result["controls"].items()]
    out.print("\n".join(["held-out:", *rows, json.dumps({k: v for k, v in result.items() if k.startswith("ppo_vs")}),
                         f"written: {out_dir / 'recipe.json'}"]), highlight=False, soft_wrap=True)


@train_app.command("table")
def train_table_cmd(
    runs: list[Path] = typer.Argument(..., exists=True, file_okay=False, help="`train recipe` folders (any arms "
                                      "and seeds; each arm's seeds are combined)"),
    out_file: Optional[Path] = typer.Option(None, "--out", help="the table as JSON (e.g. docs/data/recipe_h200.json; "
                                            "the markdown beside it as .md)"),
    resamples: int = typer.Option(DEFAULTS.eval.bootstrap, min=100, help="bootstrap resamples of the tasks"),
) -> None:
    """The held-out table over arms and seeds: mean ± std over seeds, intervals over tasks with every seed pooled,
    PPO against each earlier stage paired by task."""
    from ..rl.recipe_table import markdown, read_run, recipe_table

    writable(out_file, "--out", file=True)
    try:
        table = recipe_table([read_run(r) for r in runs], resamples)
    except ValueError as exc:
        fail(str(exc))
    text = markdown(table)
    out.print(text, highlight=False, soft_wrap=True, markup=False)
    if out_file:
        out_file.write_text(json.dumps(table, indent=2))
        out_file.with_suffix(".md").write_text(text + "\n")
        err.print(f"written: {out_file} and {out_file.with_suffix('.md')}", highlight=False)
