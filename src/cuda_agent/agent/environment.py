"""The agent's environment, independent of who drives it (a chat model, a scripted replay, an RL rollout).

`reset(reference)` makes a fresh workspace and returns the opening messages and tool schemas; `step(name,
arguments)` runs one tool and returns the observation; `result()` re-judges the best verified candidate from a
clean copy and returns the episode's outcome. Every candidate the judge verified is snapshotted; the best is the
highest reward, then the fastest.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..judge import Judge
from ..judge.pool import JudgePool
from ..judge.verdict import Verdict
from ..workspace.build import TEMPLATE_DIR
from ..workspace.candidate import Candidate, load_candidate
from ..workspace.single_file import ExportError, to_single_file
from .summary import Outcome
from .tools import Tools, ToolError, schemas

SYSTEM_PROMPT = """You are an expert GPU kernel engineer working in a sandboxed workspace. Your job: make the \
PyTorch module in model.py faster with your own kernels, verified correct by the judge. Work like an engineer: \
read, write, compile, verify, profile, iterate. Use the tools; call finish when done."""

STARTER = '''import torch
import torch.nn as nn

import cuda_extension  # built from kernels/ by the judge


class ModelNew(nn.Module):
    """Same constructor arguments, parameters and outputs as reference.Model; computation in your kernels."""

    def __init__(self, *args):
        super().__init__()
        raise NotImplementedError("write ModelNew")

    def forward(self, *inputs):
        raise NotImplementedError
'''


@dataclass
class StepResult:
    observation: str
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Snapshot:
    index: int
    path: Path
    verdict: Verdict

    def rank(self) -> tuple[int, float]:
        t = self.verdict.times_us.get("candidate")
        return self.verdict.reward, -(t if t else float("inf"))


def skill_text(backend: str) -> str:
    return resources.files("cuda_agent.agent").joinpath("skills", f"{backend}.md").read_text()


def opening_messages(source: str, backend: str, compact: bool = False) -> list[dict[str, str]]:
    """An episode's first messages: the system prompt, then the task (the reference's source and SKILL.md;
    `compact`: SKILL.md stays in the workspace, ~1,400 SmolLM2 tokens less)."""
    skill = "SKILL.md (read it first)" if compact else "SKILL.md (below)"
    task = (f"Optimise this module for the `{backend}` backend. It is in model.py; the workspace holds {skill}, "
            f"a starter model_new.py, kernels/ and the judge's binding files.\n\n## model.py\n\n"
            f"```python\n{source}\n```" + ("" if compact else f"\n\n{skill_text(backend)}"))
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task}]


SURROGATE = re.compile("[\ud800-\udfff]")  # (lone: Python strings may hold them, UTF-8 may not)
SYSTEM_DIRS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/run", "/sbin", "/sys", "/usr")


def hideable(folder: Path) -> Path:
    """`folder`, resolved, where hiding it from the agent's bash leaves the system usable: not `/`, a top-level
    folder (tool chains live in /opt, /work...) or a folder of the system's."""
    path = Path(folder).resolve()
    if len(path.parts) < 3 or any(path.is_relative_to(d) for d in SYSTEM_DIRS):
        raise ValueError(f"{folder} cannot be hidden from the agent: it is /, a top-level or a system folder")
    return path


def utf8(text: str) -> str:
    """An observation the tokenizer and the endpoint's JSON can encode: lone surrogates (a path the model escaped as
    `\\udcff`, a file name that is not UTF-8) become U+FFFD."""
    return SURROGATE.sub("\ufffd", text)


class Environment:
    def __init__(self, judge: Judge | JudgePool, run_dir: Path, use_sandbox: bool = True, bash_timeout: int = 180,
                 compact: bool = False, episodes_root: Path | None = None):
        """`compact`: for small contexts, the compact tool set and SKILL.md left in the workspace. `episodes_root`:
        the folder holding the run folders of episodes played side by side, hidden from the agent's bash (its own
        workspace stays writable) and from the judge's candidates so that no episode copies another's kernels.
        Without one, `run_dir` is hidden from the candidates: the judge runs its own copy of a candidate, and a
        file of the agent's read at run time would be missing from that copy and from `best/`."""
        if judge.config.policy != "strict":  # rewards (and what the agent is told) follow CUDA Agent's rules only
            raise ValueError(f"the agent needs a judge with the strict policy, not {judge.config.policy!r}")
        if use_sandbox and not judge.sandboxed:
            raise ValueError("use_sandbox needs a sandboxed judge (JudgeConfig(sandbox='required'))")
        self.judge, self.run_dir = judge, Path(run_dir)
        self.use_sandbox, self.bash_timeout, self.compact = use_sandbox, bash_timeout, compact
        self.hidden = (hideable(episodes_root),) if episodes_root else ()
        for path in self.hidden or (self.run_dir.resolve(),):  # from the candidates' processes and compilers
            judge.conceal(path)
        self.workspace = self.run_dir / "workspace"
        self.snapshots: list[Snapshot] = []
        self.tools: Tools | None = None
        self.reference: Path | None = None

    # ---- interface --------------------------------------------------------------------------------------
    def reset(self, reference: str | Path) -> dict[str, Any]:
        self.reference = Path(reference).resolve()
        source = self.reference.read_text()
        if self.workspace.exists():
            shutil.rmtree(self.workspace)
        (self.workspace / "kernels").mkdir(parents=True)
        (self.workspace / "model.py").write_text(source)
        (self.workspace / "SKILL.md").write_text(skill_text(self.judge.backend.name))
        (self.workspace / "model_new.py").write_text(STARTER)
        for name in ("binding.cpp", "binding_registry.h"):
            shutil.copyfile(TEMPLATE_DIR / name, self.workspace / name)
        self.snapshots = []
        offered = schemas(self.compact)
        self.tools = Tools(self.workspace, self.reference, self.judge, self.use_sandbox, self.bash_timeout,
                           tuple(s["function"]["name"] for s in offered), self.hidden)
        return {"messages": opening_messages(source, self.judge.backend.name, self.compact), "tools": offered}

    def step(self, name: str, arguments: dict[str, Any]) -> StepResult:
        if self.tools is None:
            raise RuntimeError("call reset() first")
        try:
            result = self.tools.call(name, arguments)
        except ToolError as exc:
            return StepResult(utf8(f"error: {exc}"), info={"error": True})
        info: dict[str, Any] = {}
        if result.verdict is not None:
            info["verdict"] = result.verdict.to_dict()
            snapshot = self._record(result.verdict, result.candidate)
            if snapshot is not None:
                info["snapshot"] = snapshot.index
        return StepResult(utf8(result.observation), done=name == "finish", info=info)

    def best(self) -> Snapshot | None:
        return max(self.snapshots, key=Snapshot.rank) if self.snapshots else None

    def result(self) -> Outcome:
        """Re-judge the best snapshot from a clean copy; the episode's answer."""
        best = self.best()
        outcome = Outcome(snapshots=len(self.snapshots))
        if best is None:
            return outcome
        final_dir = self.run_dir / "best"
        if final_dir.exists():
            shutil.rmtree(final_dir)
        load_candidate(best.path).write_to(final_dir)
        verdict = self.judge.evaluate(self.reference, final_dir)
        (self.run_dir / "best_verdict.json").write_text(json.dumps(verdict.to_dict(), indent=2))
        outcome.best_snapshot, outcome.best_dir, outcome.final_verdict = best.index, str(final_dir), verdict.to_dict()
        try:
            single = self.run_dir / "best_single_file.py"
            single.write_text(to_single_file(load_candidate(final_dir), self.judge.backend.name))
            outcome.best_single_file = str(single)
        except ExportError as exc:
            outcome.best_single_file = f"not written: {exc}"
        return outcome

    # ---- snapshots --------------------------------------------------------------------------------------
    def _record(self, verdict: Verdict, candidate: Candidate) -> Snapshot | None:
        """A verified candidate not seen before, saved as the next snapshot (None: not correct, or seen)."""
        if not verdict.correct or any(s.verdict.candidate["hash"] == candidate.hash for s in self.snapshots):
            return None
        index = len(self.snapshots)
        path = self.run_dir / "snapshots" / f"{index:03d}"
        candidate.write_to(path)
        (path / "verdict.json").write_text(json.dumps(verdict.to_dict(), indent=2))
        self.snapshots.append(Snapshot(index, path, verdict))
        return self.snapshots[-1]

