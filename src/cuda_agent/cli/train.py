"""`train` (the paper's stages on one GPU), `train demo` and `train verl`; every default is rl/config.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Optional

import typer

from ..backend import BackendError
from ..rl.config import DemoConfig, PPOConfig, StageConfig, TrainConfig
from ..rl.rft import run_folders
from ..task import TaskError, task_files
from . import common
from .common import app, err, fail, integers, out, warn_unsandboxed, writable
from .options import BACKEND_HELP, Backends, Stages

ActorLr = Annotated[float, typer.Option(min=0.0, help="actor learning rate (the paper's)")]
CriticLr = Annotated[float, typer.Option(min=0.0, help="critic learning rate (the paper's; with LoRA: its updates')")]
SaveEvery = Annotated[int, typer.Option(min=1, help="checkpoint every N steps (and at the end)")]
KeepCheckpoints = Annotated[int, typer.Option(min=1, help="checkpoints kept: the newest N (OUT/checkpoint-STEP; "
                                              "OUT/checkpoint is the newest)")]
Temperature = Annotated[float, typer.Option(min=0.01, help="sampling temperature of the rollouts (training "
                                            "recomputes log-probs at the same one)")]
LoraRank = Annotated[int, typer.Option(min=0, help="train the actor's LoRA updates of this rank only, saved small "
                                       "in checkpoint/actor/adapter, and a critic that trains its own and its head "
                                       "(checkpoint/critic/adapter; 0: every weight)")]
LoraAlpha = Annotated[float, typer.Option(min=0.0, help="LoRA's scale is alpha / rank")]
Group = Annotated[int, typer.Option(min=1, help="episodes of one task in a PPO / value step (dividing --batch); > 1: "
                                    "an episode's advantage is its return less its group's mean, not the critic's "
                                    "value")]
SaveOptimizer = Annotated[bool, typer.Option("--save-optimizer/--no-save-optimizer", help="keep the optimizers' "
                                             "state in checkpoints (twice the weights' size; without it a resume "
                                             "starts the optimizers afresh)")]

train_app = typer.Typer(add_completion=False, no_args_is_help=True,
                        help="Reinforcement learning on the environment (docs/training.md).")


@train_app.command("demo")
def train_demo_cmd(
    out_dir: Path = typer.Option(..., "--out", help="run folder: metrics.jsonl, episodes.jsonl, checkpoints "
                                 "(a run folder with a checkpoint resumes)"),
    backend: Backends = typer.Option("cuda", help=BACKEND_HELP),
    steps: int = typer.Option(DemoConfig.steps, min=1, help="PPO steps (in total, counting a resumed run's)"),
    batch: int = typer.Option(DemoConfig.batch, min=2, help="episodes per step"),
    model: Optional[Path] = typer.Option(None, help="an HF causal-LM folder (default: the packaged SmolLM2-135M, "
                                         "fetched on first use)"),
    random_init: bool = typer.Option(False, "--random-init", help="fresh weights of the model's config instead "
                                     "of its weights (the tokenizer and shape only)"),
    actor_lr: ActorLr = TrainConfig.actor_lr,
    critic_lr: CriticLr = TrainConfig.critic_lr,
    seed: int = typer.Option(DemoConfig.seed, help="sampling and initialisation seed"),
    temperature: Temperature = DemoConfig.temperature,
    save_every: SaveEvery = DemoConfig.save_every,
    keep_checkpoints: KeepCheckpoints = DemoConfig.keep_checkpoints,
    save_optimizer: SaveOptimizer = DemoConfig.save_optimizer,
    time_limit: Optional[float] = typer.Option(None, min=1.0, help="seconds: stop after the step that passes it "
                                               "(checkpointed; the same command continues)"),
    gpus: Optional[str] = typer.Option(None, help="judge GPUs, e.g. 0,1 (default: the current device)"),
    cache_dir: Optional[Path] = typer.Option(None, help="judge cache (builds, baselines)"),
) -> None:
    """PPO on a task where the reply picks a kernel (and its block size), each pick really built and judged:
    watch the mean reward rise."""
    writable(out_dir, "--out")
    writable(cache_dir, "--cache-dir")
    from ..rl.demo import run_demo

    if backend not in ("cuda", "cpu"):
        fail(f"unknown backend {backend!r} (choose cuda or cpu)")
    try:
        import transformers  # noqa: F401
    except ImportError:
        fail("training needs transformers: pip install -e '.[serve]' (or bash scripts/setup.sh)")
    from ..backend import detect_cuda_arch

    try:
        if backend == "cuda":
            detect_cuda_arch()  # no GPU: say so before fetching or loading a model
        if model is None:
            from ..local_model import ModelError, fetch

            try:
                model = fetch(log=lambda m: err.print(m, highlight=False, soft_wrap=True))
            except ModelError as exc:
                fail(str(exc))
        if not (Path(model) / "config.json").is_file():
            fail(f"{model} is not an HF model folder (no config.json)")
        config = DemoConfig(backend=backend, steps=steps, batch=batch, seed=seed, temperature=temperature,
                            save_every=save_every,
                            keep_checkpoints=keep_checkpoints, save_optimizer=save_optimizer,
                            time_limit_s=time_limit, train=TrainConfig(actor_lr=actor_lr, critic_lr=critic_lr))
        history = run_demo(config, Path(model), out_dir, random_init=random_init,
                           judge_config=common.config(cache_dir), devices=integers(gpus, "--gpus"),
                           log=lambda m: err.print(m, highlight=False, soft_wrap=True))
    except BackendError as exc:
        fail(str(exc))
    except (OSError, ValueError) as exc:  # transformers: a folder without weights or tokenizer files, ...
        fail(f"model {model}: {exc}")
    if history:
        first, last = history[0], history[-1]
        out.print(f"reward {first['reward_mean']:+.2f} (step {first['step']}) -> {last['reward_mean']:+.2f} "
                  f"(step {last['step']}); metrics in {out_dir / 'metrics.jsonl'}", highlight=False, soft_wrap=True)


def _check_stage_inputs(stage: str, model: Path, data: Path | None, runs: Path | None) -> None:
    if not (model / "config.json").is_file():
        fail(f"{model} is not an HF model folder (no config.json)")
    if stage == "rft" and (runs is None or not runs.is_dir()):
        fail("--stage rft needs --runs: a folder of episode run folders")
    if stage != "rft" and data is None:
        fail(f"--stage {stage} needs --data (tasks)")


@train_app.callback(invoke_without_command=True)
def train_cmd(
    ctx: typer.Context,
    stage: Optional[Stages] = typer.Option(None, help="the stage (docs/training.md)"),
    model: Optional[Path] = typer.Option(None, help="an HF causal-LM folder, or the previous stage's "
                                         "OUT/checkpoint/actor (its critic is taken from beside it)"),
    data: Optional[Path] = typer.Option(None, help="tasks: a reference .py, a folder of them (KernelBench "
                                        "layout too) or a `data build` export (.parquet/.jsonl)"),
    runs: Optional[Path] = typer.Option(None, help="rft: a folder of episode run folders (any depth), e.g. an "
                                        "earlier stage's OUT/episodes or optimize-suite's output"),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="run folder (a checkpoint there resumes)"),
    backend: Backends = typer.Option("cuda", help=BACKEND_HELP),
    steps: int = typer.Option(StageConfig.steps, min=1, help="steps (in total, counting a resumed run's)"),
    batch: int = typer.Option(StageConfig.batch, min=1, help="episodes per step (rft: conversations)"),
    group: Group = StageConfig.group,
    max_turns: int = typer.Option(StageConfig.max_turns, min=1, help="model turns per episode"),
    max_new_tokens: int = typer.Option(StageConfig.max_new_tokens, min=1, help="tokens per model turn"),
    max_context: int = typer.Option(StageConfig.max_context, min=64, help="tokens per episode"),
    tool_output_chars: int = typer.Option(StageConfig.tool_output_chars, min=100, help="each tool result cut to "
                                          "its head and tail of this many characters"),
    episode_time: float = typer.Option(StageConfig.episode_time_s, min=1, help="seconds an episode may run (checked "
                                       "before each reply and tool call)"),
    compact: bool = typer.Option(StageConfig.compact, "--compact/--full-tools", help="for small contexts: the "
                                 "compact tool set (read_file, write_file, edit, verify, profile, finish) and "
                                 "SKILL.md left in the workspace"),
    actor_lr: ActorLr = TrainConfig.actor_lr,
    critic_lr: CriticLr = TrainConfig.critic_lr,
    lora_rank: LoraRank = TrainConfig.lora_rank,
    lora_alpha: LoraAlpha = TrainConfig.lora_alpha,
    seed: int = typer.Option(StageConfig.seed, help="task order and sampling seed"),
    temperature: Temperature = StageConfig.temperature,
    tis_cap: Optional[float] = typer.Option(PPOConfig.tis_cap, "--tis-cap", min=1.0, help="truncated importance "
                                            "sampling: weight each token by min(trainer/sampler probability, CAP) "
                                            "(the paper's fix for a bf16/fp16 sampler; default: off)"),
    save_every: SaveEvery = StageConfig.save_every,
    keep_checkpoints: KeepCheckpoints = StageConfig.keep_checkpoints,
    save_optimizer: SaveOptimizer = StageConfig.save_optimizer,
    time_limit: Optional[float] = typer.Option(None, min=1.0, help="seconds: stop after the step that passes it"),
    device: Optional[str] = typer.Option(None, help="where the model trains (default: cuda with --backend cuda, "
                                         "for rft too)"),
    gpus: Optional[str] = typer.Option(None, help="judge GPUs, e.g. 0,1"),
    cache_dir: Optional[Path] = typer.Option(None, help="judge cache (builds, baselines)"),
) -> None:
    """Train with the paper's stages on one GPU: `cuda-agent train --stage agentic --model M --data D --out DIR`."""
    writable(out_dir, "--out")
    writable(cache_dir, "--cache-dir")
    if ctx.invoked_subcommand is not None:
        return
    if stage is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(2)
    from ..rl.stages import run_stage

    if backend not in ("cuda", "cpu"):
        fail(f"unknown backend {backend!r} (choose cuda or cpu)")
    if model is None or out_dir is None:
        fail("--model and --out are required")
    _check_stage_inputs(stage, model, data, runs)
    device = device or ("cuda" if backend == "cuda" else "cpu")
    try:
        if device.startswith("cuda") or (backend == "cuda" and stage != "rft"):
            from ..backend import detect_cuda_arch

            detect_cuda_arch()  # no GPU: say so before loading a model
        tasks = task_files(data, out_dir / "tasks") if data is not None else []
        config = StageConfig(stage=stage, steps=steps, batch=batch, group=group, max_turns=max_turns,
                             max_new_tokens=max_new_tokens, max_context=max_context, seed=seed,
                             temperature=temperature, tool_output_chars=tool_output_chars, compact=compact,
                             episode_time_s=episode_time, save_every=save_every, keep_checkpoints=keep_checkpoints,
                             save_optimizer=save_optimizer, time_limit_s=time_limit,
                             train=TrainConfig(actor_lr=actor_lr, critic_lr=critic_lr, lora_rank=lora_rank,
                                               lora_alpha=lora_alpha, ppo=PPOConfig(tis_cap=tis_cap)))
        run_dirs = run_folders(runs) if runs is not None else []
        log = lambda m: err.print(m, highlight=False, soft_wrap=True)  # noqa: E731
        if stage == "rft":
            history = run_stage(config, model, tasks, out_dir, None, device, run_dirs, log)
        else:
            from ..judge.pool import JudgePool

            with JudgePool(backend, common.config(cache_dir), devices=integers(gpus, "--gpus")) as pool:
                warn_unsandboxed(pool)
                history = run_stage(config, model, tasks, out_dir, pool, device, log=log)
    except (TaskError, BackendError, ValueError) as exc:
        fail(str(exc))
    except OSError as exc:  # transformers: a folder without weights or tokenizer files
        fail(f"model {model}: {exc}")
    last = history[-1] if history else {}
    out.print(f"{stage}: {len(history)} step(s) this run; checkpoint in {out_dir / 'checkpoint'}; metrics in "
              f"{out_dir / 'metrics.jsonl'}" + (f"; last reward {last['reward_mean']:+.2f}" if last else ""),
              highlight=False, soft_wrap=True)


@train_app.command("verl")
def train_verl_cmd(
    stage: Stages = typer.Option(..., help="the stage (docs/training.md)"),
    model: Path = typer.Option(..., help="an HF causal-LM folder"),
    critic: Optional[Path] = typer.Option(None, help="the critic's HF folder (agentic: the value stage's critic, "
                                          "merged with verl's model_merger; default: the model's backbone)"),
    out_dir: Path = typer.Option(..., "--out", help="run folder: data, verl config, launch.sh, checkpoints"),
    data: Optional[Path] = typer.Option(None, help="tasks: a reference .py, a folder of them (KernelBench layout "
                                        "too) or a `data build` export"),
    runs: Optional[Path] = typer.Option(None, help="rft: a folder of episode run folders (any depth)"),
    backend: Backends = typer.Option("cuda", help="the judge's backend on the rollout nodes"),
    judge: Literal["local", "ray"] = typer.Option("local", help="local (each rollout worker's own GPUs) or ray "
                                                  "(judge actors on the Ray cluster's GPUs outside the training pool)"),
    nodes: int = typer.Option(1, min=1, help="training nodes"),
    gpus_per_node: int = typer.Option(8, min=1, help="training GPUs per node"),
    steps: int = typer.Option(150, min=1, help="training steps (the paper's 150)"),
    batch: int = typer.Option(1024, min=1, help="tasks per step (the paper's 1024)"),
    max_turns: int = typer.Option(200, min=1, help="model turns per episode (the paper's 200)"),
    max_prompt: int = typer.Option(8192, min=64, help="prompt tokens"),
    max_response: int = typer.Option(122880, min=64, help="response tokens (prompt + response: the paper's 128k)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="write and validate everything, launch nothing"),
) -> None:
    """The stage as a verl 0.9.1 run (the `train` extra): data, configuration validated by verl, launch script."""
    writable(out_dir, "--out")
    try:
        from ..rl.verl_recipe import Recipe, prepare
    except ImportError as exc:
        fail(f"training on verl needs the `train` extra (pip install -e '.[train]'): {exc}")
    _check_stage_inputs(stage, model, data, runs)
    try:
        if critic is not None and not (critic / "config.json").is_file():
            fail(f"--critic {critic} is not an HF model folder (no config.json)")
        recipe = Recipe(stage, model.resolve(), out_dir.resolve(), backend, judge, nodes, gpus_per_node, steps,
                        batch, max_turns, max_prompt, max_response, critic.resolve() if critic else None)
        tasks = [t.resolve() for t in task_files(data, out_dir / "tasks")] if data is not None else None
        run_dirs = run_folders(runs) if runs is not None else None
        script = prepare(recipe, tasks, run_dirs)
    except (TaskError, ValueError) as exc:
        fail(str(exc))
    out.print(f"{stage}: verl config {out_dir / f'verl_{stage}.yaml'}, data in {out_dir / 'data'}; launch: {script}",
              highlight=False, soft_wrap=True)
    if dry_run:
        return
    import importlib.util
    import subprocess

    if not any(importlib.util.find_spec(engine) for engine in ("vllm", "sglang")):
        fail("verl's rollouts need vLLM or SGLang on this machine (not installed); the run is written: launch "
              f"{script} where they are")
    raise typer.Exit(subprocess.call([str(script)]))


app.add_typer(train_app, name="train")  # after its callback (the stages) is registered
