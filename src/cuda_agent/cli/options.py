"""Options that more than one command takes, declared once (where a library dataclass owns a default, the command
takes it from there: `JudgeConfig.atol`, ...)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Optional

import typer

from .. import llm

Backends = Literal["cuda", "cpu"]
Stages = Literal["warmup", "rft", "value", "agentic"]
BACKEND_HELP = "cuda (the product) or cpu (C++/OpenMP kernels, for machines without a GPU)"
SUITE_HELP = "suite in KernelBench layout (level1/19_ReLU.py ...)"


SANDBOX_HELP = ("candidate isolation: auto (namespaces where they work, else plain processes, with a warning), "
                "required (refuse without them), none")
POLICY_HELP = ("strict (CUDA Agent's rules: compute only in your own kernels; what rewards use) or kernelbench "
               "(KernelBench's: torch ops allowed in ModelNew; every correctness and timing check kept)")


# the model's sampling and the agent's sandbox, for optimize and optimize-suite alike
TEMPERATURE = typer.Option(llm.TEMPERATURE, min=0.0, help="sampling temperature")
TOP_P = typer.Option(None, min=0.0, max=1.0, help="nucleus sampling")
MAX_TOKENS = typer.Option(llm.MAX_TOKENS, min=1, help="tokens per reply")
TOOL_FORMAT = typer.Option("native", help="native (the endpoint's `tools`) or text (tools described in the system "
                           "message, calls parsed from <tool_call> tags: for chat templates without tools, e.g. the "
                           "SmolLM2 of `cuda-agent model serve`)")
EPISODE_TIME = typer.Option(None, "--episode-time", min=1.0, help="seconds an episode may run (checked before "
                            "each reply and tool call; default: no limit)")
AGENT_SANDBOX = typer.Option("required", "--sandbox", help="the agent's commands and its candidates: required "
                             "(refuse without the sandbox), auto, none")


# The judge's options, declared once for eval and eval-suite; each takes its default from JudgeConfig.
Atol = Annotated[float, typer.Option(min=0.0, help="absolute tolerance")]
Rtol = Annotated[float, typer.Option(min=0.0, help="relative tolerance")]
Trials = Annotated[int, typer.Option(min=1, help="random input sets to verify each candidate on")]
AllowTf32 = Annotated[bool, typer.Option(help="allow TF32 in baselines and candidates alike")]
CompileMode = Annotated[str, typer.Option(help="torch.compile mode of the baseline (default, reduce-overhead, "
                                               "max-autotune, ...)")]
Timeout = Annotated[float, typer.Option(min=1.0, help="seconds a candidate process may take to load, verify and time")]
MaxErrorRatio = Annotated[float, typer.Option(min=1.0, help="strict precision: fail when the error vs fp64 exceeds "
                                                            "this many times fp32 eager's own")]
CacheDir = Annotated[Optional[Path], typer.Option(help="judge cache (default ~/.cache/cuda-agent or "
                                                       "$CUDA_AGENT_CACHE)")]
SandboxMode = Annotated[Literal["auto", "required", "none"], typer.Option("--sandbox", help=SANDBOX_HELP)]
Policy = Annotated[Literal["strict", "kernelbench"], typer.Option(help=POLICY_HELP)]
TIMING_HELP = ("ours (the judge's clock: what verdicts and rewards use), or also KernelBench's own timing beside it "
               "(kernelbench: its current loop, CUDA events, L2 flushed, 100 trials; kernelbench-v0.1: its first "
               "release's, no flush), measured in the candidate's process and reported as that")
Timing = Annotated[Literal["ours", "kernelbench", "kernelbench-v0.1"], typer.Option("--timing", help=TIMING_HELP)]


# Exit codes (README "Exit codes"): 0 the command did its work (a verdict was produced, whatever its reward),
# 1 a candidate was rejected and --fail-on-reject was given, 2 bad usage or input (the message says which).
EXIT_REJECTED, EXIT_USAGE = 1, 2
FAIL_ON_REJECT = typer.Option(False, "--fail-on-reject", help="exit 1 when a candidate is not correct (for scripts "
                              "and CI; default: exit 0 whenever a verdict was produced)")
OVERWRITE = typer.Option(False, "--overwrite", help="write into an --out folder that holds other files (an earlier "
                         "run's, another command's)")
