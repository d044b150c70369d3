"""The dataset build: crawl, compose, filter in parallel workers, deduplicate, export (`cuda-agent data build`).

Candidate k is composed from seed `seed + k`, so a build is reproducible and resumable: every attempt is
appended to `attempts.jsonl` as it finishes (kept or rejected, with the checks), and a restarted build skips
the attempts already there. The export (`dataset.parquet`, `dataset.jsonl`, `stats.json`, `stats.md`) is
rewritten from the attempts at the end.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from .catalog import crawl_all
from .compose import Composition, NoTask, compose, compose_llm, draw_source
from .families import LONG_ROW_SHARE, SPLITS, expert_blocker, family_ops, resized, split_of
from .filters import Check, FilterConfig, check_task, check_task_sandboxed
from .similarity import Index, fingerprint, operator_sequence


DUPLICATE_RULE = "operator sequence differs from every kept task's"


@dataclass
class BuildConfig:
    target: int
    out: Path
    filters: FilterConfig = field(default_factory=FilterConfig)
    kernelbench: Path | None = None  # suite for the similarity filter (all .py files below it)
    max_kernelbench_similarity: float = 0.9
    workers: int = 2
    seed: int = 0
    composer: LLMComposer | ReplayComposer | None = None  # None: the offline composer
    transformers: bool = True  # crawl transformers operators (standalone tasks, the paper's 1.18% share)
    transformers_share: float | None = None  # 0-1, instead of the paper's share
    max_attempts: int | None = None  # default 20 x target
    time_limit_s: float | None = None  # stop starting attempts after this long, finish the running ones, export
    family: str = "all"  # "expert": only tasks the expert fuses (data/families.py)
    held_out: float = 0.0  # share of operator combinations in the held-out split
    unseen_ops: tuple[str, ...] = ()  # operators whose tasks are only in the unseen_op split
    unseen_shapes: int = 0  # train tasks re-sized into the unseen_shape split

    def __post_init__(self):
        if not 0.0 <= self.held_out < 1.0:
            raise ValueError(f"held_out must be in [0, 1), got {self.held_out}")
        if self.family == "expert":
            self.transformers = False  # the expert fuses torch operators only
            if self.composer is not None:  # its check runs the task's code, which only the sandbox may do for a model's
                raise ValueError("the expert family is built by the offline composer only")


@dataclass
class LLMComposer:
    """Tasks written by a model behind an OpenAI-compatible endpoint (the agent's client); run only sandboxed."""
    model: str
    base_url: str | None = None
    temperature: float = 1.0
    max_tokens: int = 4096  # a task is a page of code; small models otherwise ramble to their context's end

    def client_for(self, index: int):
        from ..llm import OpenAIClient

        return OpenAIClient(self.model, self.base_url, temperature=self.temperature, max_tokens=self.max_tokens)


@dataclass
class ReplayComposer:
    """Saved model replies, reply k answering attempt k (tests; re-running a build without the endpoint)."""
    replies: list[dict]

    def client_for(self, index: int):
        from ..llm import ScriptedClient

        return ScriptedClient([self.replies[index % len(self.replies)]])


def _attempt(index: int, seed: int, cfg: FilterConfig, composer, workdir: Path, transformers: bool,
             transformers_share: float | None, family: str = "all") -> dict[str, Any]:
    """Worker: compose candidate `index` and run the execution filters on it (sandboxed for model-written code)."""
    import torch

    torch.set_num_threads(1)
    rng = random.Random(seed + index)
    ops, _, hf_ops, _ = _catalog(transformers, family)
    source = draw_source(rng, transformers_share if transformers else 0.0)
    num_ops = 1 if source == "transformers" else int(source.split("#")[1])
    head = {"index": index, "data_source": source, "num_ops": num_ops}
    if source == "transformers":  # standalone, as crawled: no composer involved
        op = rng.choice(hf_ops)
        comp = Composition([op.name], op.source, ())
    elif composer is None:
        comp = compose(ops, rng, num_ops, long_rows=LONG_ROW_SHARE[family])
    else:
        from ..llm import LLMError

        try:
            comp = compose_llm(composer.client_for(index), ops, rng, num_ops)
        except (LLMError, NoTask) as exc:
            why = f"model error: {exc}" if isinstance(exc, LLMError) else f"the reply held no usable task: {exc}"
            return {**head, "ops": [], "kept": False, "source": "",
                    "checks": [asdict(Check("composes", False, detail=why))]}
    if comp is None:
        return {**head, "ops": [], "kept": False, "source": "",
                "checks": [asdict(Check("composes", False, detail="no chain of fitting shapes found"))]}
    blocker = expert_blocker(comp.source) if family == "expert" else None
    if blocker:
        return {**head, "ops": comp.ops, "kept": False, "source": comp.source,
                "checks": [asdict(Check("expert_fuses", False, detail=blocker))]}
    if composer is None or source == "transformers":
        result = check_task(comp.source, cfg)
    else:
        result = check_task_sandboxed(comp.source, cfg, workdir / f"attempt{index}")
    return {**head, "ops": comp.ops, **result.to_dict(), "kept": result.passed}


_CATALOG: dict[bool, tuple] = {}


def _catalog(transformers: bool, family: str = "all") -> tuple:
    """(torch operators of `family`, their rejects, transformers operators, their rejects), crawled once per
    process."""
    if (transformers, family) not in _CATALOG:
        ops, failed, hf_ops, hf_failed = crawl_all(transformers)
        _CATALOG[transformers, family] = family_ops(ops, family), failed, hf_ops, hf_failed
    return _CATALOG[transformers, family]


class Builder:
    def __init__(self, cfg: BuildConfig):
        self.cfg = cfg
        cfg.out.mkdir(parents=True, exist_ok=True)
        self.attempts_path = cfg.out / "attempts.jsonl"
        if cfg.filters.device == "cuda":
            import torch

            gib = torch.cuda.get_device_properties(0).total_memory / 2**30
            if cfg.workers * cfg.filters.memory_budget_gb > 0.95 * gib:
                raise ValueError(f"{cfg.workers} workers x {cfg.filters.memory_budget_gb:g} GiB do not fit the GPU's "
                                 f"{gib:.0f} GiB: lower --workers or --memory-gb")
        self.index = Index.from_suite(cfg.kernelbench)
        if cfg.unseen_ops:
            names = {op.name for op in _catalog(cfg.transformers, cfg.family)[0]}
            unknown = sorted(set(cfg.unseen_ops) - names)
            if unknown:
                raise ValueError(f"unseen ops {', '.join(unknown)} are not operators of the {cfg.family} family "
                                 f"(e.g. {', '.join(sorted(names)[:6])})")
        self.kept: dict[tuple[str, ...], int] = {}  # operator sequence -> the kept attempt that has it
        self.records: dict[int, dict] = {}
        if self.attempts_path.exists():  # resume
            for line in self.attempts_path.read_text().splitlines():
                if line.strip():
                    rec = json.loads(line)
                    self.records[rec["index"]] = rec
                    if rec["kept"]:
                        self.kept[operator_sequence(rec["source"])] = rec["index"]

    def kept_count(self) -> int:
        return sum(1 for r in self.records.values() if r["kept"])

    def run(self, progress: Callable[[int, int, dict | None], None] = lambda kept, tried, rec: None) -> dict:
        cfg = self.cfg
        started, kept_before = time.monotonic(), self.kept_count()
        limit = cfg.max_attempts or 20 * cfg.target
        todo = (i for i in range(limit) if i not in self.records)
        with open(self.attempts_path, "a") as log:
            pool = self._pool()
            running: dict = {}
            try:
                while self.kept_count() < cfg.target:
                    out_of_time = cfg.time_limit_s is not None and time.monotonic() - started > cfg.time_limit_s
                    while len(running) < cfg.workers and not out_of_time:
                        index = next(todo, None)
                        if index is None:
                            break
                        running[self._submit(pool, index)] = index
                    if not running:
                        break
                    done, _ = wait(running, return_when=FIRST_COMPLETED)
                    for fut in done:
                        index = running.pop(fut)
                        try:
                            rec = fut.result()
                        except BrokenProcessPool:  # a task crashed its worker: record it, start a fresh pool
                            rec = self._failure(index, "crashed the worker")
                            pool.shutdown(cancel_futures=True)
                            pool = self._pool()
                            for other, idx in list(running.items()):
                                running.pop(other)
                                running[self._submit(pool, idx)] = idx
                        except Exception as exc:  # the attempt raised outside its checks: record, go on
                            rec = self._failure(index, f"{type(exc).__name__}: {str(exc)[:200]}")
                        self._similarity(rec)
                        self.records[index] = rec
                        log.write(json.dumps(rec) + "\n")
                        log.flush()
                        progress(self.kept_count(), len(self.records), rec)
            finally:
                pool.shutdown(cancel_futures=True)
        hours = (time.monotonic() - started) / 3600
        self.last_run = {"seconds": round(hours * 3600, 1), "kept": self.kept_count() - kept_before,
                         "kept_per_hour": round((self.kept_count() - kept_before) / hours, 1) if hours else None,
                         "workers": cfg.workers, "device": cfg.filters.device}
        return self.export()

    def _submit(self, pool: ProcessPoolExecutor, index: int):
        cfg = self.cfg
        return pool.submit(_attempt, index, cfg.seed, cfg.filters, cfg.composer, cfg.out / "scratch", cfg.transformers,
                           cfg.transformers_share, cfg.family)

    @staticmethod
    def _failure(index: int, why: str) -> dict:
        return {"index": index, "ops": [], "num_ops": 0, "kept": False, "source": "",
                "checks": [asdict(Check("runs_in_eager", False, detail=why))]}

    def _pool(self) -> ProcessPoolExecutor:
        # spawn, not fork: forking a process that runs torch (and torch.compile's workers) can deadlock
        return ProcessPoolExecutor(max_workers=self.cfg.workers, mp_context=multiprocessing.get_context("spawn"))

    def _similarity(self, rec: dict) -> None:
        """The dataset-level rules, in the parent: benchmark similarity, then near-duplicates of kept tasks."""
        if not rec["kept"]:
            return
        if self.index.items:
            score, where = self.index.max_similarity(fingerprint(rec["source"]))
            rec["max_kernelbench_similarity"] = round(score, 4)
            rec["checks"].append(asdict(Check("kernelbench_similarity", score <= self.cfg.max_kernelbench_similarity,
                                              round(score, 4), self.cfg.max_kernelbench_similarity, where or "")))
        sequence = operator_sequence(rec["source"])
        other = self.kept.get(sequence)
        rec["checks"].append(asdict(Check("not_a_duplicate", other is None, " -> ".join(sequence), DUPLICATE_RULE,
                                          "" if other is None else f"same operators as attempt {other}")))
        rec["kept"] = all(c["passed"] for c in rec["checks"])
        if rec["kept"]:
            self.kept[sequence] = rec["index"]

    def export(self) -> dict:
        rows = [self._row(r) for i, r in sorted(self.records.items()) if r["kept"]][: self.cfg.target]
        out = self.cfg.out
        with open(out / "dataset.jsonl", "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        write_parquet(rows, out / "dataset.parquet")
        stats = self.stats(rows, self._write_splits(rows))
        (out / "stats.json").write_text(json.dumps(stats, indent=2))
        (out / "stats.md").write_text(stats_markdown(stats))
        return stats

    def _write_splits(self, rows: list[dict]) -> dict[str, int]:
        """`splits/SPLIT.jsonl`, rows as in the dataset; unseen_shape: the first train tasks at another row length.
        Returns the count of each split."""
        cfg, folder = self.cfg, self.cfg.out / "splits"
        folder.mkdir(exist_ok=True)
        resized_rows, rng = [], random.Random(cfg.seed)
        for row in (r for r in rows if r["split"] == "train"):
            if len(resized_rows) >= cfg.unseen_shapes:
                break
            code = resized(row["code"], rng)
            if code is not None and (cfg.family != "expert" or expert_blocker(code) is None):
                resized_rows.append({**row, "code": code, "split": "unseen_shape", "eager_ms": None,
                                     "compile_ms": None})
        counts = {}
        for split in SPLITS:
            chosen = [r for r in rows + resized_rows if r["split"] == split]
            path = folder / f"{split}.jsonl"
            path.unlink(missing_ok=True)
            if chosen:
                path.write_text("".join(json.dumps(r) + "\n" for r in chosen))
            counts[split] = len(chosen)
        return counts

    def _row(self, rec: dict) -> dict:
        return {"split": split_of(rec["ops"], self.cfg.held_out, self.cfg.unseen_ops),
                "code": rec["source"], "ops": json.dumps(rec["ops"]),
                "data_source": rec.get("data_source", f"torch#{rec['num_ops']}"),
                "composer": "offline" if self.cfg.composer is None else type(self.cfg.composer).__name__,
                "num_ops": rec["num_ops"], "eager_ms": rec["eager_ms"], "compile_ms": rec["compile_ms"],
                "output_mean": rec["output_stats"].get("mean"), "output_std": rec["output_stats"].get("std"),
                "output_abs_max": rec["output_stats"].get("abs_max"),
                "max_kernelbench_similarity": rec.get("max_kernelbench_similarity"), "attempt": rec["index"]}

    def stats(self, rows: list[dict], splits: dict[str, int]) -> dict:
        rejected = Counter()
        for rec in self.records.values():
            if not rec["kept"]:
                rejected[next((c["name"] for c in rec["checks"] if not c["passed"]), "unknown")] += 1
        composition = Counter(r["data_source"] for r in rows)
        ops, failed, hf_ops, hf_failed = _catalog(self.cfg.transformers, self.cfg.family)
        return {"kept": len(rows), "attempts": len(self.records), "rejected_by": dict(rejected),
                "last_run": getattr(self, "last_run", None),
                "composition": {k: round(v / max(1, len(rows)), 4) for k, v in sorted(composition.items())},
                "family": self.cfg.family, "splits": splits,
                "thresholds": {**asdict(self.cfg.filters),
                               "max_kernelbench_similarity": self.cfg.max_kernelbench_similarity,
                               "not_a_duplicate": DUPLICATE_RULE, "transformers_share": self.cfg.transformers_share,
                               "kernelbench": str(self.cfg.kernelbench) if self.cfg.kernelbench else None},
                "catalog": {"operators": len(ops), "not_instantiated": failed,
                            "transformers_operators": len(hf_ops) if self.cfg.transformers else None,
                            "transformers_not_instantiated": hf_failed}}


def write_parquet(rows: list[dict], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = ["code", "split", "ops", "data_source", "composer", "num_ops", "eager_ms", "compile_ms", "output_mean",
               "output_std", "output_abs_max", "max_kernelbench_similarity", "attempt"]
    table = pa.table({c: [r.get(c) for r in rows] for c in columns})
    pq.write_table(table, path)


def stats_markdown(stats: dict) -> str:
    run = stats.get("last_run") or {}
    lines = [f"# Dataset build: {stats['kept']} tasks kept of {stats['attempts']} attempts", "",
             f"Last run: {run.get('kept')} kept in {run.get('seconds')} s ({run.get('kept_per_hour')} per hour, "
             f"{run.get('workers')} workers, {run.get('device')}).", "",
             "| rejected by | count |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in sorted(stats["rejected_by"].items(), key=lambda kv: -kv[1])]
    lines += ["", f"Family: {stats['family']}. Splits (by operator combination): " +
              ", ".join(f"{k} {v}" for k, v in stats["splits"].items()) + ".", ""]
    lines += ["", "| data_source | share |", "|---|---|"]
    lines += [f"| {k} | {v:.1%} |" for k, v in stats["composition"].items()]
    catalog = stats["catalog"]
    hf = ("not crawled" if catalog["transformers_operators"] is None else
          f"{catalog['transformers_operators']}; not instantiated: {len(catalog['transformers_not_instantiated'])}")
    lines += ["", f"Operators in the catalog: torch {catalog['operators']}; not instantiated: "
                  f"{len(catalog['not_instantiated'])}. transformers {hf} (reasons in stats.json).", "",
              "Thresholds: `" + json.dumps(stats["thresholds"]) + "`", ""]
    return "\n".join(lines)

