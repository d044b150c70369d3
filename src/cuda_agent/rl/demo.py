"""The learning demo: PPO on a task where the model's reply picks a kernel (and on the GPU its block size), and every
pick is written into a workspace, built, verified and timed by the real judge through the agent's Environment.

The task is `demo_task/BACKEND/affine_relu.py` (4M floats on cuda, 1M on cpu). Kernels: A vectorised, B one element
per thread, C wrong (no * 0.5), D uncoalesced chunks; on the cuda backend a second slot picks 32, 128, 256 or 1024
threads per block. The reward is the milestone reward of the episode's final verdict (`Environment.result()`: -1
wrong, 1 correct, 2 faster than eager, 3 faster than torch.compile), so what the policy can learn is whatever the
judge measures. Episodes of one step that made the same pick share one judged episode (each step judges every
distinct pick afresh).

    cuda-agent train demo --backend cuda --steps 40 --out runs/demo
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Callable

import torch

from ..agent.environment import Environment, opening_messages
from ..agent.loop import LoopConfig, run_episode
from ..agent.summary import EpisodeSummary
from ..judge.config import JudgeConfig
from ..judge.pool import JudgePool
from ..llm import ScriptedClient
from . import checkpoints
from .choice import ChoiceReply, Slot
from .models import Actor, Critic
from .tokens import TurnTokenizer
from .config import DemoConfig
from .train_loop import run_steps
from .trainer import Batch, PPOTrainer

TASK_DIR = resources.files("cuda_agent.rl").joinpath("demo_task")
KERNELS = {"A": ("vector", "16-byte vector loads, grid-stride loop"),
           "B": ("scalar", "one element per thread"),
           "C": ("unscaled", "fused, without the final * 0.5"),
           "D": ("chunked", "each thread a contiguous chunk of 64 elements")}
THREADS = {"1": 32, "2": 128, "3": 256, "4": 1024}
SOURCE = {"cuda": "cu", "cpu": "cpp"}


def slots(backend: str) -> list[Slot]:
    kernel = Slot("kernel", {key: text for key, (_, text) in KERNELS.items()})
    if backend == "cpu":  # no launch configuration on the CPU
        return [kernel]
    return [kernel, Slot("threads per block", {key: str(n) for key, n in THREADS.items()})]


def reference(backend: str) -> Path:
    """The demo task's reference file for `backend`."""
    return Path(str(TASK_DIR.joinpath(backend, "affine_relu.py")))


def candidate_files(backend: str, texts: list[str]) -> dict[str, str]:
    """The workspace files of a pick (option texts, e.g. ["A", "3"])."""
    variant = KERNELS[texts[0]][0]
    threads = THREADS[texts[1]] if len(texts) > 1 else 256
    ext = SOURCE[backend]
    folder = TASK_DIR.joinpath(backend)
    return {f"kernels/affine_relu.{ext}": folder.joinpath(f"{variant}.{ext}").read_text(),
            "kernels/affine_relu_binding.cpp": folder.joinpath("binding.cpp").read_text(),
            "model_new.py": TASK_DIR.joinpath("model_new.py").read_text().replace("{threads}", str(threads))}


def judge_pick(pool: JudgePool, task: Path, run_dir: Path, files: dict[str, str], episodes_root: Path) -> dict:
    """One episode of the agent's Environment with a fixed sequence of tool calls: write the files, verify,
    finish; the reward is that of `result()`'s re-judged final verdict (-1 when nothing verified)."""
    env = Environment(pool, run_dir, use_sandbox=pool.sandboxed, episodes_root=episodes_root)
    env.reset(task)
    for path, content in files.items():
        env.step("write_file", {"path": path, "content": content})
    verify = env.step("verify", {})
    env.step("finish", {})
    outcome = env.result()
    final = outcome.final_verdict
    first = verify.info.get("verdict") or {}
    verdict = final or first
    return {"reward": final["reward"] if final else -1, "times_us": verdict.get("times_us", {}),
            "error": verdict.get("error"), "correct": bool(final and final.get("correct"))}


def expert_runs(pool: JudgePool, out: Path, count: int = 2) -> list[EpisodeSummary]:
    """`count` agent episodes in which a scripted expert solves the demo task through the loop and the judge (kernel
    A, 256 threads: written, verified, finished), as run folders `out/NN` like `optimize` writes: seed data for the
    rft stage where no strong model is at hand. Returns their summaries."""
    files = candidate_files(pool.backend.name, ["A", "3"] if pool.backend.name == "cuda" else ["A"])

    def call(name: str, arguments: dict) -> dict:
        return {"type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}

    script = [{"role": "assistant", "content": "The vectorised kernel, its binding and ModelNew.",
               "tool_calls": [call("write_file", {"path": p, "content": c}) for p, c in files.items()]},
              {"role": "assistant", "content": "Checking it.", "tool_calls": [call("verify", {})]},
              {"role": "assistant", "content": "Correct and fast: done.", "tool_calls": [call("finish", {})]}]
    task = reference(pool.backend.name)
    summaries = []
    for i in range(count):
        run_dir = Path(out) / f"{i:02d}"
        summaries.append(run_episode(Environment(pool, run_dir, use_sandbox=pool.sandboxed, episodes_root=Path(out)),
                                     ScriptedClient(script), task, run_dir, LoopConfig(max_turns=len(script))))
    return summaries



def build_models(model: Path, random_init: bool, device: str, dtype: torch.dtype) -> tuple[Actor, Critic]:
    """The actor and critic from an HF folder: its weights, or (random_init) fresh weights of its config."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    if not random_init:
        return Actor.load(model, device, dtype), Critic.load(model, device, dtype)
    config = AutoConfig.from_pretrained(model)
    lm = AutoModelForCausalLM.from_config(config, dtype=dtype).to(device)
    backbone = AutoModel.from_config(config, dtype=dtype)
    backbone.load_state_dict(lm.model.state_dict())  # the critic starts from the actor's weights
    return Actor(lm.eval()), Critic(backbone, config.hidden_size).to(device).eval()


def run_demo(config: DemoConfig, model: Path, out: Path, *, random_init: bool = False, device: str | None = None,
             judge_config: JudgeConfig | None = None, devices: list[int] | None = None,
             log: Callable[[str], None] = print) -> list[dict]:
    """Train for `config.steps` steps (resuming from `out`'s latest checkpoint when it has one); returns the
    metrics."""
    from transformers import AutoTokenizer

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    device = device or ("cuda" if config.backend == "cuda" else "cpu")
    dtype = torch.float32
    checkpoint = checkpoints.latest(out)
    resuming = checkpoint is not None
    source = checkpoint / "actor" if resuming else Path(model)
    tokenizer = AutoTokenizer.from_pretrained(source)
    if resuming:
        actor, critic = Actor.load(checkpoint / "actor", device, dtype), Critic.load(checkpoint / "critic", device,
                                                                                        dtype)
    else:
        torch.manual_seed(config.seed)
        actor, critic = build_models(Path(model), random_init, device, dtype)
    reply = ChoiceReply(TurnTokenizer(tokenizer), slots(config.backend), config.temperature)
    task = reference(config.backend)
    judge_config = judge_config or JudgeConfig()
    with JudgePool(config.backend, judge_config, devices=devices) as pool:
        opening = opening_messages(task.read_text(), config.backend)
        opening[-1] = {"role": "user", "content": opening[-1]["content"] + "\n\n" + reply.instructions()}
        prompt = reply.turns.start(opening).ids
        trainer = PPOTrainer(actor, critic, config.train, reply.logprob_fn(len(prompt)))
        extra = trainer.restore(checkpoint, log) if resuming else {}
        generator = torch.Generator().manual_seed(config.seed + 1)
        if "generator" in extra:
            generator.set_state(extra["generator"])
        (out / "config.json").write_text(json.dumps({"model": str(model), "random_init": random_init,
                                                     "prompt_tokens": len(prompt), **asdict(config)}, indent=2))
        if resuming:
            log(f"resuming at step {trainer.step} from {checkpoint}")
        else:
            start = dict(zip(reply.slots[0].options, reply.distribution(actor.model, prompt)))
            (out / "start.json").write_text(json.dumps({"p_first_slot": start}, indent=2))

        def step() -> dict:
            began = time.monotonic()
            choices, logp = reply.sample(actor.model, prompt, config.batch, generator)
            judged, judge_s = _judge_step(pool, task, reply, config, out, trainer.step + 1, choices)
            scores = [judged[tuple(c)]["reward"] for c in choices]
            stats = trainer.update(_batch(reply, prompt, choices, logp, scores))
            probs = reply.distribution(actor.model, prompt)
            return {"reward_mean": statistics.fmean(scores), "pass_rate": sum(s >= 1 for s in scores) / len(scores),
                    "picks": _counts(reply, choices),
                    "rewards_by_pick": {"".join(reply.texts(list(c))): r["reward"] for c, r in judged.items()},
                    "p_first_slot": dict(zip(reply.slots[0].options, [round(p, 4) for p in probs])),
                    "judge_seconds": judge_s, "seconds": time.monotonic() - began, **stats}

        def describe(step: int, record: dict) -> str:
            probs = " ".join(f"{p:.2f}" for p in record["p_first_slot"].values())
            return (f"step {step}/{config.steps}  reward {record['reward_mean']:+.2f}  pass {record['pass_rate']:.0%}"
                    f"  p({'/'.join(reply.slots[0].options)}) {probs}  policy {record['policy_loss']:+.3f}  value "
                    f"{record['value_loss']:.3f}  {record['seconds']:.1f}s (judge {record['judge_seconds']:.1f}s)")

        return run_steps(trainer, step, out, config, tokenizer=tokenizer, describe=describe, log=log,
                         state=lambda: {"generator": generator.get_state()})


def _judge_step(pool: JudgePool, task: Path, reply: ChoiceReply, config: DemoConfig, out: Path, step: int,
                choices: list[list[int]]) -> tuple[dict, float]:
    """Every distinct pick of the step judged in its own episode, all at once on the pool; logged to
    episodes.jsonl."""
    began = time.monotonic()
    picks = sorted({tuple(c) for c in choices})
    folder = out / "episodes" / f"step_{step:04d}"

    def one(pick: tuple[int, ...]) -> dict:
        texts = reply.texts(list(pick))
        return judge_pick(pool, task, folder / "".join(texts), candidate_files(config.backend, texts),
                          out / "episodes")

    with ThreadPoolExecutor(max(1, min(len(picks), pool.workers))) as threads:
        results = dict(zip(picks, threads.map(one, picks)))
    with (out / "episodes.jsonl").open("a") as f:
        for pick, result in results.items():
            f.write(json.dumps({"step": step, "pick": "".join(reply.texts(list(pick))), **result}) + "\n")
    if not config.keep_episodes:
        shutil.rmtree(folder, ignore_errors=True)
    return results, time.monotonic() - began


def _batch(reply: ChoiceReply, prompt: list[int], choices: list[list[int]], logp: torch.Tensor,
           scores: list[int]) -> Batch:
    trajectories = [reply.trajectory(prompt, c, logp[i].tolist()) for i, c in enumerate(choices)]
    ids = torch.tensor([t.ids for t in trajectories])  # all of one length: one prompt, fixed-length replies
    return Batch(ids, torch.ones_like(ids), len(prompt), torch.tensor([t.mask for t in trajectories]),
                 torch.tensor([t.logprobs for t in trajectories]), torch.tensor(scores, dtype=torch.float))


def _counts(reply: ChoiceReply, choices: list[list[int]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for c in choices:
        key = "".join(reply.texts(c))
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))
