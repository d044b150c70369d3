"""`train eval`: a model's held-out table (rl/evaluation.py), for a checkpoint or an OpenAI-compatible endpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ..backend import BackendError
from ..llm import LLMError
from ..rl.config import EvalConfig
from ..task import TaskError, task_files
from . import common
from .common import fail, integers, out, warn_unsandboxed, writable
from .options import BACKEND_HELP, Backends
from .train import Temperature, train_app


@train_app.command("eval")
def train_eval_cmd(
    data: Path = typer.Option(..., help="held-out tasks: a reference .py, a folder of them or a dataset (e.g. "
                              "splits/held_out.jsonl)"),
    out_dir: Path = typer.Option(..., "--out", help="folder: episodes/, episodes.jsonl, eval.json, eval.md (rerun "
                                 "to resume)"),
    model: Optional[Path] = typer.Option(None, help="a local model: an HF folder, a stage's checkpoint/actor or "
                                         "its LoRA adapter (checkpoint/actor/adapter)"),
    root_model: Optional[Path] = typer.Option(None, "--root-model", help="an adapter's root model, where the "
                                              "folder it names is not on this machine"),
    endpoint: Optional[str] = typer.Option(None, help="or a model name behind an OpenAI-compatible endpoint"),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="the endpoint (key from $OPENAI_API_KEY)"),
    backend: Backends = typer.Option("cuda", help=BACKEND_HELP),
    samples: int = typer.Option(EvalConfig.samples, min=1, help="episodes per task"),
    seed: int = typer.Option(EvalConfig.seed, help="sampling seed (and the bootstrap's)"),
    batch: int = typer.Option(EvalConfig.batch, min=1, help="episodes played at once"),
    temperature: Temperature = EvalConfig.temperature,
    max_turns: int = typer.Option(EvalConfig.max_turns, min=1, help="model turns per episode"),
    max_new_tokens: int = typer.Option(EvalConfig.max_new_tokens, min=1, help="tokens per model turn"),
    max_context: int = typer.Option(EvalConfig.max_context, min=64, help="tokens per episode (local model)"),
    tool_output_chars: int = typer.Option(EvalConfig.tool_output_chars, min=100, help="each tool result cut to "
                                          "its head and tail of this many characters"),
    episode_time: float = typer.Option(EvalConfig.episode_time_s, min=1, help="seconds an episode may run (checked "
                                       "before each reply and tool call)"),
    compact: bool = typer.Option(EvalConfig.compact, "--compact/--full-tools", help="the compact tool set and "
                                 "SKILL.md left in the workspace"),
    device: Optional[str] = typer.Option(None, help="where a local model runs (default: cuda with --backend cuda)"),
    gpus: Optional[str] = typer.Option(None, help="judge GPUs, e.g. 0,1"),
    cache_dir: Optional[Path] = typer.Option(None, help="judge cache (builds, baselines)"),
) -> None:
    """Play every held-out task SAMPLES times and write the table: pass rate, shares of reward 2 and 3, mean reward
    (95% intervals over tasks), speedup vs torch.compile, malformed calls, turns."""
    from ..judge.pool import JudgePool
    from ..rl import evaluation

    writable(out_dir, "--out")
    writable(cache_dir, "--cache-dir")
    if (model is None) == (endpoint is None):
        fail("give one of --model (a local checkpoint) or --endpoint (a served model)")
    if model is not None and not any((model / name).is_file() for name in ("config.json", "adapter_config.json")):
        fail(f"{model} is neither an HF model folder (config.json) nor a LoRA adapter (adapter_config.json)")
    config = EvalConfig(samples=samples, seed=seed, temperature=temperature, batch=batch, max_turns=max_turns,
                        max_new_tokens=max_new_tokens, max_context=max_context, tool_output_chars=tool_output_chars,
                        compact=compact, episode_time_s=episode_time)
    device = device or ("cuda" if backend == "cuda" else "cpu")
    try:
        tasks = task_files(data, out_dir / "tasks")
        with JudgePool(backend, common.config(cache_dir), devices=integers(gpus, "--gpus")) as pool:
            warn_unsandboxed(pool)
            log = lambda m: common.err.print(m, highlight=False, soft_wrap=True)  # noqa: E731
            if model is not None:
                player = evaluation.local_player(model, config, pool, device, root_model, log)
                described = {"model": str(model), "kind": "checkpoint"}
            else:
                from ..llm import OpenAIClient

                OpenAIClient(endpoint, base_url).check()
                player = evaluation.endpoint_player(endpoint, base_url, config, pool)
                described = {"model": endpoint, "kind": "endpoint", "base_url": base_url}
            result = evaluation.evaluate(tasks, out_dir, config, player, described, log)
    except (TaskError, BackendError, ValueError) as exc:
        fail(str(exc))
    except LLMError as exc:
        fail(f"endpoint {base_url or 'api.openai.com'} unusable: {exc}")
    except OSError as exc:
        fail(f"model {model}: {exc}")
    out.print((out_dir / "eval.md").read_text(), highlight=False, soft_wrap=True)
    out.print(f"written: {out_dir / 'eval.json'} (summary: {json.dumps(result['summary'])})", highlight=False,
              soft_wrap=True)


@train_app.command("audit")
def train_audit_cmd(
    folder: Path = typer.Argument(..., metavar="EVAL_DIR", help="an evaluation folder (`train eval --out`, or a "
                                  "recipe's eval_ppo/)"),
    out_file: Path = typer.Option(..., "--out", help="the markdown page to write"),
    top: int = typer.Option(20, min=1, help="kernels to lay out, best first (each task once)"),
) -> None:
    """The hand audit for reward hacking: the evaluation's best kernels with their tasks, verdicts and questions."""
    from ..rl.audit import write_audit

    if not (folder / "episodes.jsonl").is_file():
        fail(f"{folder}: no episodes.jsonl (give a `train eval --out` folder or a recipe's eval_* folder)")
    writable(out_file, "--out", file=True)
    try:
        count = write_audit(folder, out_file, top)
    except ValueError as exc:
        fail(str(exc))
    if not count:
        fail(f"{folder}: no episode verified a kernel (reward >= 1): nothing to audit")
    out.print(f"{count} kernels to audit: {out_file}", highlight=False, soft_wrap=True)
