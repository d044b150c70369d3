"""Held-out evaluation (`cuda-agent train eval`): `samples` episodes per task of a model, judged, summarised with
confidence intervals (scores.py). The model is a local checkpoint (an HF folder, or a stage's `checkpoint/actor`:
its episodes play `batch` at a time on one batch sampler) or any OpenAI-compatible endpoint, so the same table can
be had for a large model served elsewhere. Every episode keeps its run folder (trajectory, summary, snapshots: the
hand audit reads them) and a line in `episodes.jsonl`; a rerun resumes. `eval.json` and `eval.md` hold the result.
"""

from __future__ import annotations

import json
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from ..agent.environment import Environment
from ..agent.loop import LoopConfig, run_episode
from ..agent.summary import EpisodeSummary
from ..judge.pool import JudgePool
from . import rft
from .config import EvalConfig
from .scores import EpisodeRecord, per_task, summary

def record_of(task: Path, sample: int, run_dir: Path) -> EpisodeRecord:
    """An episode's record, read back from its run folder."""
    records = rft.read_trajectory(run_dir / "trajectory.jsonl")
    done = EpisodeSummary.from_dict(json.loads((run_dir / "summary.json").read_text()))
    malformed = sum(1 for r in records if r.get("type") == "tool" and (
        (r["message"].get("content") or "").startswith(rft.UNREADABLE)
        or (r.get("error") and any(m in (r["message"].get("content") or "") for m in rft.MALFORMED))))
    malformed += sum(r.get("malformed") or (r["message"].get("content") or "").startswith(rft.UNREADABLE)
                     for r in records if r.get("type") == "user")  # unreadable <tool_call> blocks (text tools)
    return EpisodeRecord(str(task), sample, done.reward, (done.final_verdict or {}).get("speedup_vs_compile"),
                         done.turns, sum(1 for r in records if r.get("type") == "assistant"), malformed, done.stop,
                         str(run_dir))


Player = Callable[[list[tuple[Path, int, Path]]], None]  # plays each (task, sample, run folder) of a chunk


def local_player(model: Path, config: EvalConfig, pool: JudgePool, device: str, root: Path | None = None,
                 log: Callable[[str], None] = print, out_of_time: Callable[[], bool] = lambda: False) -> Player:
    """Episodes of a local model (an HF folder, or a LoRA adapter rebuilt on `root` or the model it names), a chunk
    at a time on one batch sampler (seeded by the config and the chunk), each one's end logged. Once `out_of_time()`
    the replies being sampled stop: their episodes' folders are removed (played again by a rerun) and the chunk
    raises TimeoutError."""
    from transformers import AutoTokenizer

    from ..agent.tools import schemas
    from .batcher import BatchSampler
    from .models import Actor
    from .rollout import play
    from .tokens import TurnTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    actor = Actor.load(model, device, root=root)
    turns = TurnTokenizer(tokenizer, schemas(config.compact), tool_format="text")
    loop = _loop(config)
    chunks = [0]

    def run(chunk: list[tuple[Path, int, Path]]) -> None:
        chunks[0] += 1
        sampler = BatchSampler(actor.model, tokenizer.pad_token_id, config.temperature,
                               seed=config.seed * 1_000_003 + chunks[0], out_of_time=out_of_time,
                               weights=actor.decoding_weights)
        sampler.expected, lock = len(chunk), threading.Lock()

        def one(job):
            task, k, run_dir = job
            try:
                done = play(environment(pool, run_dir, config), sampler, turns, task, run_dir, loop,
                            config.max_new_tokens).summary
                log(f"eval: {task.stem} sample {k}: reward {done.reward}, {done.turns} turns ({done.stop})")
            except TimeoutError:
                shutil.rmtree(run_dir, ignore_errors=True)  # cut short: not an episode
                raise
            finally:
                with lock:
                    sampler.expected -= 1

        try:
            with ThreadPoolExecutor(len(chunk), thread_name_prefix="eval") as threads:
                list(threads.map(one, chunk))
        finally:
            sampler.close()
    return run


def endpoint_player(model: str, base_url: str | None, config: EvalConfig, pool: JudgePool) -> Player:
    """Episodes of a model behind an OpenAI-compatible endpoint, a chunk's episodes at once."""
    from ..llm import OpenAIClient

    loop = _loop(config)

    def one(job):
        task, _, run_dir = job
        client = OpenAIClient(model, base_url, temperature=config.temperature, max_tokens=config.max_new_tokens)
        run_episode(environment(pool, run_dir, config), client, task, run_dir, loop)

    def run(chunk: list[tuple[Path, int, Path]]) -> None:
        with ThreadPoolExecutor(len(chunk), thread_name_prefix="eval") as threads:
            list(threads.map(one, chunk))
    return run


def environment(pool: JudgePool, run_dir: Path, config: EvalConfig) -> Environment:
    """An episode's environment; the others' run folders (OUT/episodes/TASK/SAMPLE) hidden from its bash."""
    return Environment(pool, run_dir, use_sandbox=pool.sandboxed, compact=config.compact,
                       episodes_root=run_dir.parents[1])


def _loop(config: EvalConfig) -> LoopConfig:
    return LoopConfig(max_turns=config.max_turns, max_context=config.max_context,
                      tool_output_chars=config.tool_output_chars, time_limit_s=config.episode_time_s)


def evaluate(tasks: list[Path], out: Path, config: EvalConfig, player: Player, described: dict,
             log: Callable[[str], None] = print, out_of_time: Callable[[], bool] = lambda: False) -> dict:
    """Every task `config.samples` times (those already in `out` kept), then `eval.json` / `eval.md`. Once
    `out_of_time()` no further batch starts: TimeoutError (a rerun plays the rest)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(Path(task), k, out / "episodes" / f"{i:04d}_{Path(task).stem}" / f"sample_{k}")
            for i, task in enumerate(tasks) for k in range(config.samples)]
    todo = [job for job in jobs if not (job[2] / "summary.json").is_file()]
    if len(todo) < len(jobs):
        log(f"eval: {len(jobs) - len(todo)} of {len(jobs)} episodes played before, {len(todo)} to play")
    for first in range(0, len(todo), config.batch):
        if out_of_time():
            raise TimeoutError(f"time limit reached in {out.name} after {first} of {len(todo)} episodes")
        chunk = todo[first:first + config.batch]
        for _, _, run_dir in chunk:
            shutil.rmtree(run_dir, ignore_errors=True)  # an episode cut short by a crash is played again
        player(chunk)
        for task, k, run_dir in chunk:
            shutil.rmtree(run_dir / "workspace", ignore_errors=True)  # trajectory, summary and snapshots stay
        log(f"eval: {min(first + config.batch, len(todo))}/{len(todo)} episodes played")
    records = [record_of(task, k, run_dir) for task, k, run_dir in jobs]
    (out / "episodes.jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in records))
    result = {"model": described, "config": asdict(config), "tasks": [str(t) for t in tasks],
              "summary": summary(records, config.bootstrap, config.seed), "per_task": per_task(records)}
    (out / "eval.json").write_text(json.dumps(result, indent=2))
    (out / "eval.md").write_text(markdown(result["summary"], described))
    return result


def markdown(row: dict, described: dict) -> str:
    def ci(metric: str) -> str:
        lo, hi = row[f"{metric}_ci"]
        return f"{row[metric]:.3f} [{lo:.3f}, {hi:.3f}]"

    speed = row["geomean_speedup_vs_compile"]
    return "\n".join([
        f"# Held-out evaluation: {described.get('model')}", "",
        f"{row['tasks']} tasks, {row['episodes']} episodes; 95% intervals from a bootstrap over tasks.", "",
        "| pass rate | reward >= 2 | reward 3 | mean reward | speedup vs compile (passing, geomean) | "
        "malformed calls per turn | mean turns |", "|---|---|---|---|---|---|---|",
        f"| {ci('pass_rate')} | {ci('share_2')} | {ci('share_3')} | {ci('mean_reward')} | "
        f"{'-' if speed is None else f'{speed:.2f}x'} | {row['malformed_call_rate']:.3f} | {row['mean_turns']:.2f} |",
        ""])
