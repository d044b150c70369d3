"""KernelBench's own run layout and metrics, for `eval-suite` (issue 33).

A KernelBench generation folder holds `level_L_problem_P_sample_S_kernel.py` files side by side (several samples
per problem; P is the number that starts the problem's file name). Its headline metric is `fast_p`: the share of
all problems whose sample 0 is correct and faster than the baseline by more than p (its `score.fastp`, over
`benchmark_eval_analysis.py`'s thresholds). Under `--policy kernelbench` a verdict's `strict_findings` say what
the strict judge would have failed it on; `finding_kinds` names them for the report. Under `--timing kernelbench`
each correct verdict also holds KernelBench's own timing (made in the candidate's process): `timing_view` sets its
speedups beside the judge's. Where the folder holds KernelBench's own results of the run (`eval_results.json`, as
its `eval_from_generations.py` writes it), `published` reads each sample's and `published_view` counts where the
verdicts here agree with them.
"""

from __future__ import annotations

import functools
import json
import math
import re
import statistics
from collections import Counter
from pathlib import Path

RESULTS_FILE = "eval_results.json"
# as KernelBench writes them: ASCII digits, no leading zeros (`sample_00` or `problem_019` would be a second spelling
# of one sample: ignored)
SAMPLE_FILE = re.compile(r"level_([1-9][0-9]*)_problem_([1-9][0-9]*)_sample_(0|[1-9][0-9]*)_kernel\.py", re.ASCII)
FAST_P = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)
MAX_RESULTS_BYTES = 64 << 20  # an eval_results.json larger than this is not read
KINDS = (  # (kind, what a finding of it says) in the order they are looked for
    ("state dict", "state dict"), ("extra shape", "extra shape"), ("scaled inputs", "scaled inputs"),
    ("input changed in place", "modified in place"), ("timed call", "timed call"), ("precision", "precision:"),
    ("speed of light", "speed of light"), ("process ended", "candidate process"),
    ("torch calls in the source", "source (strict would fail)"), ("torch calls in the library", "native code"),
    ("torch ops at run time", "runtime ops (strict would fail)"),
)


def geomean(xs: list[float]) -> float | None:
    """The geometric mean (None of nothing)."""
    xs = [x for x in xs if isinstance(x, (int, float)) and math.isfinite(x) and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def is_generation_folder(folder: Path) -> bool:
    """Whether `folder` is laid out as KernelBench's generations are (sample files at its top)."""
    return Path(folder).is_dir() and any(SAMPLE_FILE.fullmatch(p.name) for p in Path(folder).iterdir())


def problem_id(task_file: Path) -> int | None:
    found = re.match(r"(\d+)_", task_file.name)
    return int(found.group(1)) if found else None


def samples(folder: Path, level: str, task_file: Path) -> list[tuple[int, Path]]:
    """The task's samples in a generation folder, by sample id."""
    wanted = (int(level.removeprefix("level")), problem_id(task_file))
    found = []
    for path in Path(folder).iterdir():
        m = SAMPLE_FILE.fullmatch(path.name)
        if m and (int(m.group(1)), int(m.group(2))) == wanted:
            found.append((int(m.group(3)), path))
    return sorted(found)


def fast_p(verdicts: list[dict], n: int, key: str) -> dict[str, float]:
    """For each threshold p, the share of the `n` problems whose verdict is correct with `key` (a speedup) > p."""
    speedups = [v.get(key) for v in verdicts if v["correct"]]
    return {f"fast_{p:g}": sum(1 for s in speedups if s is not None and s > p) / n if n else 0.0 for p in FAST_P}


def finding_kinds(findings: list[str]) -> list[str]:
    """The kinds of a verdict's strict findings (each kind once; "other" for what no kind names)."""
    kinds = []
    for finding in findings:
        kind = next((k for k, says in KINDS if says in finding), "outputs outside the judge's rule"
                    if finding.startswith("incorrect:") else "other")
        if kind not in kinds:
            kinds.append(kind)
    return kinds


def strict_view(verdicts: list[dict]) -> dict:
    """Under the kernelbench policy: how many pass KernelBench's rules, how many would also pass the strict judge's
    other checks (no finding), and the findings by kind among those that pass KernelBench's."""
    passing = [v for v in verdicts if v["correct"]]
    n = len(verdicts)
    counts = Counter(kind for v in passing for kind in finding_kinds(v.get("strict_findings") or []))
    return {"pass_rate": len(passing) / n if n else 0.0,
            "pass_rate_without_findings": sum(1 for v in passing if not v.get("strict_findings")) / n if n else 0.0,
            "findings_by_kind": dict(counts.most_common())}


def timing_view(verdicts: list[dict]) -> dict | None:
    """The speedups by KernelBench's timing method (`verdict.kernelbench_timing`) beside the judge's, over the
    correct verdicts timed both ways: geometric means, `fast_p` over all problems, and the median ratio of
    KernelBench's speedup to the judge's per task (None when nothing was timed its way)."""
    measured = [v["kernelbench_timing"] for v in verdicts if v["correct"] and v.get("kernelbench_timing")]
    if not measured:
        return None
    timed = [v for v in verdicts if v["correct"] and (v.get("kernelbench_timing") or {}).get("speedup_vs_eager")]
    n = len(verdicts)

    out: dict = {"method": measured[0]["method"], "timed": len(timed), "failed": sum(1 for k in measured
                                                                                     if k.get("error"))}
    for base in ("eager", "compile"):
        key = f"speedup_vs_{base}"
        theirs = [v["kernelbench_timing"].get(key) for v in timed]
        pairs = [(t, v.get(key)) for t, v in zip(theirs, timed) if t and v.get(key)]
        out[f"geomean_{key}"] = geomean([t for t in theirs if t])
        out[f"geomean_{key}_ours"] = geomean([o for _, o in pairs])
        out[f"median_ratio_{base}"] = statistics.median(t / o for t, o in pairs) if pairs else None
        out[f"fast_p_vs_{base}"] = fast_p([{"correct": True, key: t} for t in theirs], n, key)
    return out


def published_results(folder: Path, level: int, judged: set[int]) -> dict[tuple[int, int, int], dict]:
    """KernelBench's own results of a generation folder (its `eval_results.json`: per problem id one entry, or a
    list of them by sample) by (level, problem, sample): correct, compiled, runtime in ms (None where not timed) and
    hardware. Empty without the file, or when the samples judged (`judged`: their levels) are of several levels
    (the file's keys are problem ids only). Entries not shaped as KernelBench writes them are left out."""
    path = Path(folder) / RESULTS_FILE
    if not path.is_file() or path.is_symlink() or judged != {level}:
        return {}
    stat = path.stat()
    return _published(str(path), stat.st_ino, stat.st_mtime_ns, stat.st_size, level)


@functools.lru_cache(maxsize=16)
def _published(path: str, ino: int, mtime_ns: int, size: int, level: int) -> dict[tuple[int, int, int], dict]:
    """(Read once per version of the file: its inode, modification time and size are part of the key.)"""
    if size > MAX_RESULTS_BYTES:
        return {}
    try:
        data = json.loads(Path(path).read_text(), parse_constant=lambda name: None)  # (no NaN or Infinity)
    except (OSError, ValueError, RecursionError):
        return {}
    found = {}
    for problem, entries in (data.items() if isinstance(data, dict) else ()):
        for entry in entries if isinstance(entries, list) else [entries]:
            sample = entry.get("sample_id", 0) if isinstance(entry, dict) else None
            if not (re.fullmatch(r"[1-9][0-9]{0,5}", str(problem), re.ASCII) and type(sample) is int
                    and 0 <= sample < 10**6 and type(entry.get("correctness")) is bool):
                continue
            runtime, meta, stats = entry.get("runtime"), entry.get("metadata"), entry.get("runtime_stats")
            hardware = next((d.get("hardware") for d in (meta, stats) if isinstance(d, dict) and d.get("hardware")),
                            None)
            found[(level, int(problem), sample)] = {
                "correct": entry["correctness"], "compiled": entry.get("compiled") is True,
                "runtime_ms": float(runtime) if type(runtime) in (int, float) and 0 < runtime < 1e9 else None,
                "hardware": str(hardware)[:100] if hardware is not None else None}
    return found


def published(folder: Path, level: str, task_file: Path, sample: int | None, judged: set[int]) -> dict | None:
    """KernelBench's own result for this sample of the task, where the generation folder holds one (`judged`: the
    levels of the samples judged from it)."""
    if sample is None:
        return None
    number = int(level.removeprefix("level"))
    return published_results(Path(folder), number, judged).get((number, problem_id(task_file), sample))


def published_view(records: list[dict]) -> dict | None:
    """Over records that have KernelBench's own result: its pass rate and the judge's on the same samples, how many
    agree on correctness, each disagreement (task, sample, both verdicts, the judge's error), the hardware it ran
    on, and the median of its runtime over the judge's candidate time (None when no record has one)."""
    held = [r for r in records if r.get("published")]
    if not held:
        return None
    n = len(held)
    ratios = [r["published"]["runtime_ms"] * 1e3 / r["verdict"]["times_us"]["candidate"] for r in held
              if r["published"]["runtime_ms"] and r["verdict"]["correct"]
              and (r["verdict"].get("times_us") or {}).get("candidate")]
    return {"n": n, "pass_rate_published": sum(r["published"]["correct"] for r in held) / n,
            "pass_rate_here": sum(r["verdict"]["correct"] for r in held) / n,
            "agree": sum(r["published"]["correct"] == r["verdict"]["correct"] for r in held),
            "disagree": [{"task": r["task"], "sample": r["sample"], "published": r["published"]["correct"],
                          "here": r["verdict"]["correct"], "error": r["verdict"].get("error")}
                         for r in held if r["published"]["correct"] != r["verdict"]["correct"]],
            "hardware": sorted({r["published"]["hardware"] for r in held if r["published"]["hardware"]}),
            "median_runtime_ratio": statistics.median(ratios) if ratios else None}
