"""KernelBench's own evaluation and `--policy kernelbench` on the same candidates: do they agree on correctness?

KernelBench's code is not part of this repository: `--kernelbench-src` is a clone of
github.com/ScalingIntelligence/KernelBench (or `git archive` of one revision of it), either layout: `src/eval.py`
(the first release, 48642c5, whose numbers were published) or `src/kernelbench/eval.py` (2025-12 on). Its
`eval_kernel_against_ref` runs in a child process per candidate (it runs the candidate in its own process; a
crash there is its verdict), with its defaults for what decides correctness: seed 42, 5 correctness trials, and
this judge takes that revision's fp32 tolerance (1e-2 in the first release, 1e-4 from 2025-12 on). The
modules its utilities import for calling LLM APIs and never use in evaluation (dotenv, litellm, together, ...)
are stubbed where they are not installed. Needs a GPU.

Candidates: `--suite DIR --solutions DIR` (suite-relative paths, or KernelBench's generation layout) and/or
`--builtin`: the tests' single-file candidates, and ModelNew variants of a task with weights that differ from
Model's only in their names (agree: both pass) or in the order they are drawn (agree: both fail).

    python3 benchmarks/kernelbench_differential.py --kernelbench-src KB_CLONE --builtin [--suite S --solutions D]
        [--ours REPORT.json] [--jobs N] [--out differential.jsonl]

`--ours`: this judge's verdicts from `eval-suite --policy kernelbench --json` on the same suite and solutions
(judged there in parallel, resumable, with both timings) instead of judging each candidate here; `--jobs`:
KernelBench's evaluations run that many at once (correctness only, so they may share the GPU).

One JSON line per candidate (both verdicts and reasons); the summary counts agreements and lists disagreements.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from cuda_agent.judge import Judge, JudgeConfig  # noqa: E402
from cuda_agent.suite.evaluate import discover, solutions_of  # noqa: E402

DATA = ROOT / "tests" / "data"
STUBBED = ("dotenv", "litellm", "together", "google", "google.generativeai", "anthropic", "openai", "archon")
CHILD = r"""
import importlib, json, sys, tempfile, types
src, ref_path, cand_path = sys.argv[1:4]
for name in STUBBED:
    try:
        importlib.import_module(name)
    except Exception:
        stub = types.ModuleType(name)
        stub.__path__ = []
        stub.__getattr__ = lambda attr: (lambda *a, **k: None) if not attr.startswith("__") else (
            _ for _ in ()).throw(AttributeError(attr))
        sys.modules[name] = stub
sys.path.insert(0, src)
try:
    from kernelbench.eval import eval_kernel_against_ref  # 2025-12 on
except ImportError:
    sys.path.insert(0, src.rsplit("/", 1)[0])
    from src.eval import eval_kernel_against_ref  # the first release
result = eval_kernel_against_ref(open(ref_path).read(), open(cand_path).read(), seed_num=42, num_correct_trials=5,
                                 measure_performance=False, build_dir=tempfile.mkdtemp(), device=0)
print("RESULT " + json.dumps({"compiled": bool(result.compiled), "correct": bool(result.correctness),
                              "metadata": {k: str(v)[:300] for k, v in (result.metadata or {}).items()}}))
""".replace("STUBBED", repr(STUBBED))

LINEAR_GELU_NEW = ("import torch\nimport torch.nn.functional as F\n\n\nclass ModelNew(torch.nn.Module):\n"
                   "    def __init__(self, features):\n        super().__init__()\n{init}\n"
                   "    def forward(self, x):\n        return F.gelu(x @ self.w.t() + self.b)\n")
RENAMED = ("        self.w = torch.nn.Parameter(torch.empty(features, features))\n"
           "        self.b = torch.nn.Parameter(torch.empty(features))\n"
           "        torch.nn.init.kaiming_uniform_(self.w, a=5 ** 0.5)\n"
           "        torch.nn.init.uniform_(self.b, -features ** -0.5, features ** -0.5)\n")
SWAPPED = ("        self.b = torch.nn.Parameter(torch.empty(features))\n"
           "        self.w = torch.nn.Parameter(torch.empty(features, features))\n"
           "        torch.nn.init.uniform_(self.b, -features ** -0.5, features ** -0.5)\n"
           "        torch.nn.init.kaiming_uniform_(self.w, a=5 ** 0.5)\n")


def builtin(folder: Path) -> list[tuple[str, Path, Path]]:
    """The tests' single-file candidates against their task, and the parameter-name and init-order variants."""
    pairs = [(f"builtin/{c.stem}", DATA / "tasks" / "affine_relu.py", c)
             for c in sorted((DATA / "candidates").glob("*.py"))]
    for name, init in (("renamed_parameters", RENAMED), ("swapped_init_order", SWAPPED)):
        path = folder / f"{name}.py"
        path.write_text(LINEAR_GELU_NEW.format(init=init))
        pairs.append((f"builtin/{name}", DATA / "tasks" / "linear_gelu.py", path))
    return pairs


def suite_pairs(suite: Path, solutions: Path) -> list[tuple[str, Path, Path]]:
    pairs = []
    for task in discover(suite):
        for sample, path in solutions_of(solutions, task):
            if path is not None:
                pairs.append((task.name + ("" if sample is None else f" sample {sample}"), task.path, path))
    return pairs


def kernelbench_verdict(src: Path, ref: Path, cand: Path, timeout: float) -> dict:
    try:
        done = subprocess.run([sys.executable, "-c", CHILD, str(src), str(ref), str(cand)], capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"compiled": None, "correct": False, "reason": f"timed out after {timeout:.0f} s"}
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:  # KernelBench's process itself failed (a crash in the candidate's code, or its own)
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()]  # the exception first, then what led to it
        return {"compiled": None, "correct": False,
                "reason": f"exit {done.returncode}: {lines[-1] if lines else ''} | {done.stderr[-400:]}"}
    found = json.loads(line[len("RESULT "):])
    return {**found, "reason": "; ".join(f"{k}: {v}" for k, v in found["metadata"].items())[:400]}


def reported(report: Path) -> dict[str, dict]:
    """This judge's verdicts from an `eval-suite --json` report, by candidate name as suite_pairs names them."""
    records = json.loads(report.read_text())["tasks"]
    policies = {r["verdict"].get("policy") for r in records}
    if policies != {"kernelbench"}:
        sys.exit(f"{report}: judged with --policy {', '.join(map(str, policies))}; the comparison needs kernelbench")
    return {r["task"] + ("" if r.get("sample") is None else f" sample {r['sample']}"): r["verdict"] for r in records}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernelbench-src", type=Path, required=True, help="a KernelBench clone (its src/ is used)")
    ap.add_argument("--builtin", action="store_true", help="the tests' candidates and the constructed variants")
    ap.add_argument("--suite", type=Path)
    ap.add_argument("--solutions", type=Path)
    ap.add_argument("--ours", type=Path, help="this judge's verdicts: an `eval-suite --policy kernelbench --json` "
                                              "report of --suite and --solutions")
    ap.add_argument("--jobs", type=int, default=1, help="KernelBench evaluations at once")
    ap.add_argument("--limit", type=int, default=None, help="at most this many candidates")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds for KernelBench's evaluation of one")
    ap.add_argument("--out", type=Path, default=Path("differential.jsonl"))
    args = ap.parse_args()
    src = args.kernelbench_src / "src"
    if not ((src / "eval.py").exists() or (src / "kernelbench" / "eval.py").exists()):
        sys.exit(f"{args.kernelbench_src}: no src/eval.py or src/kernelbench/eval.py (a KernelBench clone?)")
    if args.ours and args.builtin:
        sys.exit("--ours holds a suite's verdicts: give it with --suite and --solutions, without --builtin")
    work = Path(tempfile.mkdtemp(prefix="kb-differential-"))
    pairs = (builtin(work) if args.builtin else []) + \
        (suite_pairs(args.suite, args.solutions) if args.suite and args.solutions else [])
    pairs = pairs[: args.limit]
    if not pairs:
        sys.exit("nothing to compare: give --builtin and/or --suite with --solutions")
    given = reported(args.ours) if args.ours else None
    # its tolerance for fp32: 1e-2 in the first release, 1e-4 from 2025-12 on (get_tolerance_for_precision)
    tolerance = 1e-4 if (src / "kernelbench").exists() else 1e-2
    print(f"KernelBench {'2025-12+' if tolerance == 1e-4 else 'first release'} layout: atol = rtol = {tolerance:g}")
    rows, began = [], time.time()
    config = JudgeConfig(policy="kernelbench", atol=tolerance, rtol=tolerance, cache_dir=work / "cache")
    with ThreadPoolExecutor(args.jobs) as runner, args.out.open("w") as out:
        theirs_of = [runner.submit(kernelbench_verdict, src, ref, cand, args.timeout) for _, ref, cand in pairs]
        judge = Judge("cuda", config) if given is None else None
        for k, ((name, ref, cand), theirs) in enumerate(zip(pairs, theirs_of)):
            ours = judge.evaluate(ref, cand).to_dict() if judge else given.get(name)
            if ours is None:
                sys.exit(f"{args.ours}: no verdict for {name} (judged with other --suite/--solutions?)")
            theirs = theirs.result()
            row = {"candidate": name, "agree": ours["correct"] == theirs["correct"],
                   "ours": {key: ours.get(key) for key in ("correct", "reward", "error", "strict_findings",
                                                             "tolerance", "speedup_vs_eager", "speedup_vs_compile",
                                                             "kernelbench_timing")},
                   "kernelbench": theirs}
            rows.append(row)
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(f"[{k + 1}/{len(pairs)}] {name}: ours {'pass' if ours['correct'] else 'fail'}, KernelBench "
                  f"{'pass' if theirs['correct'] else 'fail'}{'' if row['agree'] else '  DISAGREE'}", flush=True)
        if judge:
            judge.close()
    agree = sum(r["agree"] for r in rows)
    print(f"\n{agree}/{len(rows)} agree on correctness ({time.time() - began:.0f} s)")
    for r in rows:
        if not r["agree"]:
            print(f"  {r['candidate']}: ours {r['ours']['correct']} ({(r['ours']['error'] or '')[:160]}); "
                  f"KernelBench {r['kernelbench']['correct']} ({r['kernelbench']['reason'][:160]})")


if __name__ == "__main__":
    main()
