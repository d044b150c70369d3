"""The expert's episodes: its kernels written through the real agent loop, Environment and judge, as run folders like
`optimize` writes (trajectory.jsonl, summary.json, snapshots), which `rft.export` reads. Four shapes:

- direct: write the files, verify, profile, finish;
- improve: write them with slow knobs, profile, rewrite the kernel with fast ones, profile, finish;
- fix: write them with a planted compile error, verify (the build fails), edit it away, verify, finish;
- repair: write them with one op of the chain left out (described, planned and coded without it; where no op can
  go, a planted wrong value: 2v + 1 for the output v), verify (incorrect), name the op missed and plan every op
  again, write the kernel again, verify, profile, finish: what a failed verdict is answered with, the way a policy's
  own kernels fail (an op of model.py missed: wrong values, not builds). An episode whose planted kernel passed its
  verify is not kept.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

from ...agent.environment import Environment
from ...agent.loop import LoopConfig, run_episode
from ...agent.summary import EpisodeSummary, Stop
from ...judge.pool import JudgePool
from ...llm import ScriptedClient
from .formulas import Unsupported
from .kernels import BREAKABLE, FAST, SLOW, kernel_path, kernel_source, workspace_files
from .trace import Node, Program, trace

SHAPES = ("direct", "improve", "fix", "repair")
SCRIPT_VERSION = 3  # of the replies' text (2: the first reply lays out each op's values before the code; 3: the
# repair shape leaves an op out)
STAGED = ("improve", "fix", "repair")  # shapes whose first reply is staged (slow knobs, a planted error): context
# for SFT


def staged_turns(run_dir: str | Path) -> int:
    """How many of an expert episode's first model turns are staged (TASK/SHAPE-K): SFT reads them as context and
    learns what follows (profiling a slow kernel, repairing a failed build or wrong values), never to write them, so
    every shape's prompt has one first reply to learn (the `direct` one). Any other run folder: 0."""
    return int(Path(run_dir).name.rsplit("-", 1)[0] in STAGED)


@dataclass
class ExpertEpisode:
    task: str
    shape: str
    run_dir: str
    reward: float
    stop: str
    speedup_vs_compile: float | None


def _episode(task: Path, shape: str, run_dir: Path, summary: EpisodeSummary) -> ExpertEpisode:
    final = summary.final_verdict or {}
    return ExpertEpisode(str(task), shape, str(run_dir), summary.reward, summary.stop, final.get("speedup_vs_compile"))


def _call(name: str, **arguments) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def _turn(text: str, *calls: dict) -> dict:
    return {"role": "assistant", "content": text, "tool_calls": list(calls)}


def _describe(program: Program) -> tuple[str, str]:
    """What the task computes and what one fused kernel does about it, in the expert's words."""
    ops = " -> ".join(program.ops)
    if program.pointwise:
        return f"an element-wise chain ({ops})", "one fused kernel reads each element once and writes it once"
    return (f"element-wise ops around reductions over the last dimension ({ops})",
            "one kernel per row: a pass for each reduction, then one that writes the row, every step fused")


def _plan(program: Program) -> str:
    """Each op of the task and the values it makes, as the kernel computes them: the first reply's plan, written
    before the code that repeats it (a small model copies a formula it has just written more surely than it
    recalls one)."""
    def value(name: str) -> str:
        node = next(n for n in program.nodes if n.name == name)
        if node.reduce == "expsum":
            return f"{name} = sum over the row of expf({node.src} - {node.of})"
        if node.reduce:
            return f"{name} = {node.reduce} over the row of {node.src}"
        return f"{name} = {node.expr}"

    lines = ["Step by step (v: one value per element, r: one per row; v0: the input's element):"]
    for op, made in program.steps:
        gemm = ["v0 = the row of x times p.p[0] transposed"] if op == "linear" else []
        lines.append(f"- {op}: " + "; ".join(gemm + [value(name) for name in made]))
    params = ", ".join(f"p.p[{i}] = {name} {list(shape)}" for i, (name, shape) in enumerate(program.params))
    return "\n".join(lines) + f"\nThe output: {program.output}." + (f" Parameters: {params}." if params else "")


def planted_wrong_value(program: Program) -> Program:
    """The program with a planted wrong value: 2v + 1 for its output v, off by |v + 1| (outside any tolerance of v
    however large v is, unless v is -1 everywhere: `play_expert` drops such an episode)."""
    kind = "r" if program.reduced else "e"
    name = f"{'v' if kind == 'e' else 'r'}{len(program.nodes) + 1}"
    return replace(program, nodes=[*program.nodes, Node(name, kind, f"(2.f * {program.output} + 1.f)")], output=name)


def planted_dropped_op(program: Program) -> tuple[Program, str] | None:
    """The program with one of its ops left out, and that op: the way a policy's own kernels go wrong (it reads
    model.py's chain and misses an op). The op is one without parameters or reductions, never the only one, chosen
    by the task's ops (so the same task drops the same op); None where no op can go."""
    names = {n.name for n in program.nodes}
    droppable = []
    for i, (op, made) in enumerate(program.steps):
        nodes = [n for n in program.nodes if n.name in made]
        before = [m for _, step in program.steps[:i] for m in step]
        if (len(program.steps) > 1 and op != "linear" and len(nodes) == len(made) and nodes
                and not any(n.reduce or "p.p[" in n.expr for n in nodes)
                and made[-1][0] == (before[-1] if before else "v0")[0]):  # (its value of the kind it took)
            droppable.append(i)
    if not droppable:
        return None
    i = droppable[zlib.crc32(" ".join(program.ops).encode()) % len(droppable)]
    op, made = program.steps[i]
    before = [m for _, step in program.steps[:i] for m in step]
    source = before[-1] if before else "v0"
    swap = lambda text: re.sub(rf"\b{made[-1]}\b", source, text)  # noqa: E731
    nodes = [replace(n, expr=swap(n.expr), src=swap(n.src), of=swap(n.of)) for n in program.nodes
             if n.name not in made]
    if any(re.search(rf"\b{m}\b", n.expr + " " + n.src + " " + n.of) for m in made for n in nodes) or \
            source not in names | {"v0"}:
        return None  # (a value of the op used past it, besides its output: not a chain to cut)
    kept = program.steps[:i] + program.steps[i + 1:]
    planted = replace(program, nodes=nodes, output=swap(program.output), steps=kept,
                      ops=[o for o, _ in kept] if len(kept) == len(program.ops) - 1 else program.ops)
    return planted, op


def _planted_caught(run_dir: Path) -> bool:
    """Whether a repair episode's first verdict found its planted wrong value."""
    for line in (run_dir / "trajectory.jsonl").read_text().splitlines():
        record = json.loads(line)
        content = str((record.get("message") or {}).get("content", ""))
        if record.get("type") == "tool" and content.startswith("compiled:"):
            return "correct: False" in content
    return False


def script(program: Program, backend: str, shape: str) -> list[dict]:
    """The replies of one episode of `shape` (each a reply with its tool calls)."""
    what, how = _describe(program)
    plan = _plan(program)
    summary = f"{' -> '.join(program.ops)} fused into one kernel"
    path = kernel_path(backend)

    def writes(knobs, kernel: str | None = None) -> list[dict]:
        files = workspace_files(program, backend, knobs)
        return [_call("write_file", path=p, content=kernel if p == path and kernel else c) for p, c in files.items()]

    if shape == "direct":
        return [_turn(f"The model is {what}: {how}.\n{plan}", *writes(FAST)),
                _turn("Checking correctness.", _call("verify")),
                _turn("Correct. Timing it against eager and torch.compile.", _call("profile")),
                _turn("Fused and verified.", _call("finish", summary=summary))]
    if shape == "improve":
        return [_turn(f"The model is {what}: first a plain version, {how}.\n{plan}", *writes(SLOW)),
                _turn("Timing it.", _call("profile")),
                _turn("Rewriting the kernel with the faster settings: wider loads, more threads, warp-level "
                      "reductions, softmax in one online pass.",
                      _call("write_file", path=path, content=kernel_source(program, backend, FAST))),
                _turn("Timing it again.", _call("profile")),
                _turn("Faster and still correct.", _call("finish", summary=summary + ", tuned"))]
    if shape == "fix":
        broken = kernel_source(program, backend, FAST).replace(BREAKABLE, BREAKABLE[:-1], 1)
        return [_turn(f"The model is {what}: {how}.\n{plan}", *writes(FAST, broken)),
                _turn("Checking it.", _call("verify")),
                _turn("The build failed: a missing semicolon after `(void)config`.",
                      _call("edit", path=path, old=BREAKABLE[:-1] + "\n", new=BREAKABLE + "\n")),
                _turn("Checking again.", _call("verify")),
                _turn("Fixed and verified.", _call("finish", summary=summary))]
    if shape == "repair":
        dropped = planted_dropped_op(program)
        if dropped:
            planted, op = dropped
            first = "The model is {}: {}.\n{}".format(*_describe(planted), _plan(planted))
            answer = (f"Wrong values: model.py applies {' -> '.join(program.ops)}, and the kernel left out {op}. "
                      f"The plan again, every op:\n{plan}")
        else:
            planted = planted_wrong_value(program)
            first = f"The model is {what}: {how}.\n{plan}"
            answer = "Wrong values: the kernel does not compute the plan. Writing it again from the plan, op by op."
        return [_turn(first, *writes(FAST, kernel_source(planted, backend, FAST))),
                _turn("Checking correctness.", _call("verify")),
                _turn(answer, _call("write_file", path=path, content=kernel_source(program, backend, FAST))),
                _turn("Checking again.", _call("verify")),
                _turn("Correct. Timing it against eager and torch.compile.", _call("profile")),
                _turn("Repaired and verified.", _call("finish", summary=summary))]
    raise ValueError(f"unknown shape {shape!r} (choose from {', '.join(SHAPES)})")


def play_expert(pool: JudgePool, tasks: list[Path], out: Path, shapes: tuple[str, ...] = SHAPES, per_task: int = 1,
                parallel: int = 1, log: Callable[[str], None] = print, compact: bool = False,
                out_of_time: Callable[[], bool] = lambda: False,
                deadline: float | None = None) -> tuple[list[ExpertEpisode], dict[str, str]]:
    """Every shape `per_task` times on each task the expert can fuse, as run folders `out/TASK/SHAPE-K` (`parallel`
    at once, with the compact tool set and prompt when `compact`, as the model to be trained on them will see it);
    returns the episodes and, for each task it cannot fuse, why (also in `out/skipped.json`). `log` hears
    of each task skipped and each episode ended. Resumable: an episode whose folder holds its summary is read back,
    not played again; each one played is appended to `out/episodes.jsonl` as it ends. Once `out_of_time()`, no
    episode starts: TimeoutError (a rerun plays the rest); the episodes playing end at `deadline` (time.monotonic),
    their judge calls too, and are not kept (TimeoutError)."""
    backend = pool.backend.name
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    jobs, skipped = [], {}
    for task in tasks:
        try:
            program = trace(Path(task).read_text())
            replies = {shape: script(program, backend, shape) for shape in shapes}
        except Unsupported as exc:
            skipped[str(task)] = str(exc)
            log(f"{Path(task).name}: skipped ({exc})")
            continue
        jobs += [(Path(task), shape, k, replies[shape]) for shape in shapes for k in range(per_task)]
    (out / "skipped.json").write_text(json.dumps(skipped, indent=1))
    lock = threading.Lock()

    def play(job) -> ExpertEpisode | None:
        task, shape, k, replies = job
        run_dir = out / task.stem / f"{shape}-{k}"
        if (run_dir / "summary.json").is_file():
            episode = _episode(task, shape, run_dir, EpisodeSummary.from_dict(json.loads(
                (run_dir / "summary.json").read_text())))
            log(f"{task.name} {shape} {k}: reward {episode.reward:g} (played before)")
            return episode
        if out_of_time():
            raise TimeoutError(f"time limit reached in the expert's episodes ({out.name})")
        shutil.rmtree(run_dir, ignore_errors=True)  # an episode cut short by a crash is played again
        limit = None if deadline in (None, float("inf")) else max(0.0, deadline - time.monotonic())
        summary = run_episode(Environment(pool, run_dir, use_sandbox=pool.sandboxed, compact=compact,
                                          episodes_root=out),
                              ScriptedClient(replies),
                              task, run_dir, LoopConfig(max_turns=len(replies), time_limit_s=limit))
        if summary.stop == Stop.TIME_LIMIT or (limit is not None and time.monotonic() >= deadline):
            shutil.rmtree(run_dir, ignore_errors=True)  # cut short (a judge call may have ended early): not kept
            raise TimeoutError(f"time limit reached in the expert's episodes ({out.name})")
        if shape == "repair" and not _planted_caught(run_dir):  # its answer to a failure would follow a pass
            shutil.rmtree(run_dir, ignore_errors=True)
            log(f"{task.name} repair {k}: its planted wrong value passed verify: not kept")
            return None
        episode = _episode(task, shape, run_dir, summary)
        with lock:
            with open(out / "episodes.jsonl", "a") as f:
                f.write(json.dumps(asdict(episode)) + "\n")
            log(f"{task.name} {shape} {k}: reward {summary.reward:g} ({summary.stop})")
        return episode

    with ThreadPoolExecutor(max(1, parallel)) as executor:
        episodes = [e for e in executor.map(play, jobs) if e is not None]
    return episodes, skipped
