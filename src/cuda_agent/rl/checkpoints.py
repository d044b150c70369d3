"""A run folder's checkpoints: one `checkpoint-NNNNNN` folder per save (NNNNNN: the step), the newest `keep` of them
kept, and `checkpoint` a link to the newest: what the next stage reads (`OUT/checkpoint/actor`). A save is written
in full before the link moves to it (one rename) and before older ones are deleted, so a crash at any point leaves
a whole checkpoint to resume from."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Callable

import torch

from .trainer import PPOTrainer

LINK = "checkpoint"
STEP_FOLDER = re.compile(r"checkpoint-(\d+)")


def _step_folders(out: Path) -> list[Path]:
    """The complete checkpoints of a run folder, oldest first (one still being written ends in .tmp)."""
    found = [p for p in Path(out).glob("checkpoint-*") if STEP_FOLDER.fullmatch(p.name) and p.is_dir()]
    return sorted(found, key=lambda p: int(STEP_FOLDER.fullmatch(p.name)[1]))


def latest(out: Path) -> Path | None:
    """The checkpoint a run resumes from: the newest step folder, else a `checkpoint` folder an earlier version of
    this package wrote; None when there is neither."""
    folders = _step_folders(out)
    if folders:
        return folders[-1]
    old = Path(out) / LINK
    return old if (old / "trainer.pt").is_file() else None


def step_of(checkpoint: Path | None) -> int:
    """The step a checkpoint holds (0 for none; an earlier version's `checkpoint` folder: read from its state)."""
    if checkpoint is None:
        return 0
    match = STEP_FOLDER.fullmatch(checkpoint.name)
    if match:
        return int(match[1])
    return int(torch.load(checkpoint / "trainer.pt", weights_only=False)["step"])


def save(trainer: PPOTrainer, out: Path, tokenizer, extra: dict, *, keep: int, optimizer: bool,
         log: Callable[[str], None] = print) -> Path:
    """Write the trainer's checkpoint at its step, point `checkpoint` at it, delete all but the newest `keep`, and
    log its size on disk. Returns its folder."""
    out = Path(out)
    folder = trainer.save(out / f"checkpoint-{trainer.step:06d}", tokenizer, extra, optimizer=optimizer)
    link, old = out / LINK, out / (LINK + ".old")
    if link.is_dir() and not link.is_symlink():  # an earlier version's folder: its place goes to the link
        shutil.rmtree(old, ignore_errors=True)
        link.rename(old)
    staged = out / (LINK + ".link")
    staged.unlink(missing_ok=True)
    staged.symlink_to(folder.name)
    os.replace(staged, link)
    shutil.rmtree(old, ignore_errors=True)
    kept = {p.name for p in _step_folders(out)[-keep:]} | {folder.name}
    for stale in out.glob("checkpoint-*"):  # older checkpoints and any left half-written by a crash
        if stale.name not in kept:
            shutil.rmtree(stale, ignore_errors=True)
    log(f"checkpoint step {trainer.step}: {_size(_disk_bytes(folder))} in {folder} (optimizer state "
        f"{'kept' if optimizer else 'not kept'})")
    return folder


def has_weights(folder: Path) -> bool:
    """An actor's or critic's folder holds its weights (not only what travels: an adapter, a value head)."""
    return (Path(folder) / "config.json").is_file()


def rebuild(out: Path, start: Path, critic: bool, supervised: bool, log: Callable[[str], None] = print) -> None:
    """A finished stage folder brought from another machine with its adapters only (full weights do not travel;
    `start`, what the stage started from, has its own by now): link `checkpoint` to its newest step folder, merge the
    actor's adapter into `start`'s weights (the tokenizer: start's, which training never changes) and, with
    `critic`, the critic: for a `supervised` stage (which never trains it) the one it started with unchanged, else
    its adapter merged into that one and its head as saved. A critic trained without LoRA cannot be rebuilt: what
    needs it says so (stages.critic_beside). Nothing to do: no change."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .lora import WEIGHTS, merge
    from .models import Critic
    from .stages import critic_beside

    out = Path(out)
    folders = _step_folders(out)
    if not folders:
        return
    if not (out / LINK).exists():
        (out / LINK).symlink_to(folders[-1].name)
    actor, critic_dir = out / LINK / "actor", out / LINK / "critic"
    if not has_weights(actor):
        if not (actor / "adapter" / WEIGHTS).is_file():  # (a run packed without its adapters: only their configs)
            raise FileNotFoundError(f"{actor} holds neither the actor's weights nor a LoRA adapter's to rebuild them: "
                                    f"delete {out} and the steps after it to train it again")
        log(f"{out.name}: the actor's weights merged from its adapter on {start}")
        model = AutoModelForCausalLM.from_pretrained(start, dtype=torch.float32)
        merge(model, actor / "adapter").save_pretrained(actor)
        AutoTokenizer.from_pretrained(start).save_pretrained(actor)
    if not critic or has_weights(critic_dir):
        return
    begun = critic_beside(Path(start))
    if supervised:
        log(f"{out.name}: the critic it kept unchanged, rebuilt")
        Critic.load(begun).save(critic_dir)
    elif (critic_dir / "adapter" / WEIGHTS).is_file():
        log(f"{out.name}: the critic's weights merged from its adapter on {begun}")
        rebuilt = Critic.load(begun)
        merge(rebuilt.backbone, critic_dir / "adapter")
        rebuilt.head.load_state_dict(torch.load(critic_dir / "value_head.pt", map_location="cpu"))
        rebuilt.save(critic_dir)


def _disk_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"
