"""The training loop every stage and the demo share (`RunConfig`): steps until `steps`, a checkpoint every
`save_every` steps and at the last (the newest `keep_checkpoints` kept: checkpoints.py), a time limit that stops
after the step that passes it (checkpointed: the same command continues), one metrics line per step with the time
left. Interrupted (Ctrl-C, SIGTERM), the steps ended since the last checkpoint are saved, as they were when the last
one ended (nothing when the weights were being changed). A run resumes where its checkpoint left off: the metrics
and episode lines of later steps are dropped first, so the files always match the model."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import torch

from . import checkpoints
from .config import RunConfig
from .trainer import MetricsLog, PPOTrainer, cut_after


def run_steps(trainer: PPOTrainer, step: Callable[[], dict], out: Path, config: RunConfig, *, tokenizer,
              state: Callable[[], dict] = dict,
              describe: Callable[[int, dict], str] = lambda step, record: f"step {step}",
              log: Callable[[str], None] = print) -> list[dict]:
    """Call `step()` (one training step: it advances `trainer.step` and returns its metrics) until `config.steps`;
    checkpoints with `state()` (the caller's RNGs) beside the trainer's. Returns this run's metrics."""
    metrics = MetricsLog(out, trainer.step, log=log)
    cut_after(Path(out) / "episodes.jsonl", trainer.step)
    history, began, saved = [], time.monotonic(), trainer.step
    steps, time_limit_s = config.steps, config.time_limit_s
    ended = (trainer.step, state(), torch.get_rng_state())  # what a checkpoint of the last step ended would hold
    try:
        while trainer.step < steps:
            step_began = time.monotonic()
            record = step()
            ended = (trainer.step, state(), torch.get_rng_state())
            record.setdefault("seconds", time.monotonic() - step_began)
            metrics.write(trainer.step, record)
            history.append({"step": trainer.step, **record})
            per_step = (time.monotonic() - began) / len(history)
            left = f", about {per_step * (steps - trainer.step) / 60:.1f} min left" if trainer.step < steps else ""
            log(f"{describe(trainer.step, record)}  [{trainer.step}/{steps}, {per_step:.0f} s a step{left}]")
            out_of_time = time_limit_s is not None and time.monotonic() - began > time_limit_s
            if trainer.step % config.save_every == 0 or trainer.step == steps or out_of_time:
                checkpoints.save(trainer, out, tokenizer, state(), keep=config.keep_checkpoints,
                                 optimizer=config.save_optimizer, log=log)
                saved = trainer.step
            if out_of_time:
                log(f"time limit of {time_limit_s:.0f} s reached after step {trainer.step}: the same command "
                    "continues")
                break
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: keep the steps done since the last checkpoint when it is safe
        if trainer.updating or ended[0] != trainer.step:
            log(f"interrupted while step {trainer.step + 1} changed the weights: nothing saved (the run resumes "
                f"from step {saved})")
        elif trainer.step > saved:
            log(f"interrupted: saving step {trainer.step} before stopping (Ctrl-C again to skip)")
            torch.set_rng_state(ended[2])  # as it was when that step ended: the resumed run is the same run
            checkpoints.save(trainer, out, tokenizer, ended[1], keep=config.keep_checkpoints,
                             optimizer=config.save_optimizer, log=log)
        raise
    finally:
        metrics.close()
    return history
