"""Timing in one evaluation: the candidate beside the baselines, on inputs it has never seen, with its outputs
checked on a sample of the timed calls.

- Every call, baseline or candidate, warm-up or timed, runs on fresh input values written into the same buffers
  (`timing.py`). The candidate's seeds come from here, one just before each call, so no call's inputs exist in its
  process before the call is prepared; remembering answers is useless.
- After a timed call the judge may ask for its outputs (which calls is decided here, after they ran, so the
  candidate cannot behave only on checked calls); the reference recomputes them from the same seed and compares.
- Eager and torch.compile timings are cached per (task, device, torch version, settings), but each evaluation
  times eager briefly just before and just after the candidate. When both disagree with the cached eager the same
  way, the baselines were taken in other conditions: both are timed again (and the cache mended). Baselines timed
  now are followed at once by that check before the candidate: when it disagrees with the eager timed before
  torch.compile, the machine changed while they were timed (torch.compile's time may be too long, which the checks
  around the candidate would never see), so they are not cached, and when torch.compile's time too long by that
  ratio could move the reward, they are timed again at the next attempt. When the eager timings of this
  evaluation would give the candidate different rewards, or its own timings spread too widely, the candidate is
  timed again, and after `timing_attempts` the result is "too noisy" rather than a speed claim.
  (Noise that cannot change the reward, common for launch-bound eager, is recorded but not held against it.)
- On the GPU's trusted clock, a timing whose empty calls show another context's work on the GPU (`gpu_shared`: work
  the candidate left running would slow the baselines timed beside it; so would another evaluation's process that
  uses the GPU outside the device lock, e.g. while it starts) is a problem too, its baselines are not cached, and
  the next attempt times them again.
"""

from __future__ import annotations

import math
import secrets
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

from .config import JudgeConfig
from .scoring.reward import milestone_reward
from .store import Store
from .wire.process import WorkerProcess
from .wire.timing import draw_checks, spread

RefCall = Callable[[dict, str], dict]  # (command, expected reply event) -> reply, raising if the reference fails
CheckCall = Callable[[int, str, dict], bool]  # (seed, label, the worker's "exported" message) -> outputs correct
TimeCall = Callable[[dict], dict]  # (the timing record) -> the candidate's timing stats


class TimingFailed(Exception):
    """The candidate failed during timing (wrong outputs on a checked call, a broken protocol, a policy violation);
    str() says why."""

    def __init__(self, reason: str, violations: list[str] | None = None):
        super().__init__(reason)
        self.violations = violations or []


@dataclass
class TimingOutcome:
    baselines: dict[str, Any]
    candidate: dict[str, Any]
    record: dict[str, Any] = field(default_factory=dict)  # how the baselines were obtained; checks; status

    @property
    def noisy(self) -> bool:
        return self.record.get("status") == "too_noisy"


def stale(base: dict[str, Any], before: dict[str, Any], after: dict[str, Any], tolerance: float) -> bool:
    """Both eager timings around the candidate disagree with the baseline's eager, the same way: the baseline was
    taken in other conditions (a busy moment) and must be taken again."""
    if agree(before, base, tolerance) or agree(after, base, tolerance):
        return False
    return (before["median_us"] > base["median_us"]) == (after["median_us"] > base["median_us"])


@contextmanager
def seconds_in(record: dict[str, Any], part: str):
    """Add the block's seconds to `part` of the record's seconds (where a timed evaluation's seconds go)."""
    began = time.perf_counter()
    try:
        yield
    finally:
        record["seconds"][part] += time.perf_counter() - began


def unsettled(baselines: dict[str, Any], after: dict[str, Any] | None, tolerance: float) -> str | None:
    """Why baselines measured just now may be off: eager timed right after them (`after`) disagrees with their own
    eager, timed before torch.compile's, beyond `tolerance`: the machine changed while they were timed, and
    torch.compile may have been timed in its slow moment, whichever way eager moved (a slowdown over both baseline
    timings that ended before the check, or one that began during torch.compile's); None otherwise."""
    if after is None or baselines["compile"] is None or agree(after, baselines["eager"], tolerance):
        return None
    return (f"eager took {baselines['eager']['median_us']:.1f} us before torch.compile's baseline timing and "
            f"{after['median_us']:.1f} us after it")


def shared(baselines: dict[str, Any]) -> bool:
    """Whether the GPU clock saw another context's work while eager or torch.compile was timed."""
    return any((stats or {}).get("gpu_shared") for stats in (baselines["eager"], baselines["compile"]))


def own_spread(stats: dict[str, Any]) -> float:
    """The relative spread of a timing less the spread of the clock's own overhead (the GPU's trusted clock reads
    a few microseconds of jitter into every call: on a 3 us kernel that alone is a spread of 100%)."""
    low, high = stats.get("clock_overhead_p20_p80_us") or (0.0, 0.0)
    if stats["median_us"] <= 0:
        return math.inf
    return max(0.0, stats["p80_us"] - stats["p20_us"] - (high - low)) / stats["median_us"]


def agree(a: dict[str, Any], b: dict[str, Any], tolerance: float) -> bool:
    """Two timings of the same thing agree within `tolerance` plus half their relative spreads."""
    if a["median_us"] <= 0 or b["median_us"] <= 0:
        return False
    allowed = tolerance + 0.5 * (min(spread(a), 1.0) + min(spread(b), 1.0))
    return abs(math.log(a["median_us"] / b["median_us"])) <= math.log1p(allowed)


class Timekeeper:
    def __init__(self, config: JudgeConfig, store: Store):
        self.config, self.store = config, store

    def check_timing(self) -> dict[str, Any]:
        n = self.config.check_iters
        return {"warmup": 2, "min_iters": n, "max_iters": n, "target_time_s": 0.0}

    def run(self, baseline_key: str, ref: RefCall, time_candidate: TimeCall) -> TimingOutcome:
        """`time_candidate(record)` times the candidate once (its stats; TimingFailed when it fails)."""
        cfg = self.config
        cached = self.store.get("baselines", baseline_key)
        record: dict[str, Any] = {"source": "cache" if cached else "measured now", "eager_checks_us": [],
                                  "attempts": 0, "checked_calls": [], "status": "ok",
                                  "seconds": dict.fromkeys(("baselines", "candidate", "call_checks", "eager_checks"),
                                                           0.0)}
        # `settle`: eager timed right after the baselines were measured (None for cached ones)
        baselines, settle = (cached, None) if cached else self._measure(baseline_key, ref, record)
        fresh, unused = cached is None, settle
        candidate: dict[str, Any] = {}
        for attempt in range(1, cfg.timing_attempts + 1):
            record["attempts"] = attempt
            moved = unsettled(baselines, settle, cfg.baseline_tolerance)
            if attempt > 1 and (shared(baselines) or moved):  # another evaluation's work (...) is gone by now?
                record["source"] = "measured now"
                record["remeasured_because"] = moved or "the GPU was shared while the baselines were timed"
                (baselines, settle), fresh = self._measure(baseline_key, ref, record), True
                unused = settle
            # Baselines timed just now, in this hold of the device: the eager check that followed them is the one
            # before the candidate.
            before, unused = unused or self._eager_check(ref, record), None
            with seconds_in(record, "candidate"):
                candidate = time_candidate(record)
            after = self._eager_check(ref, record)
            record["eager_checks_us"].append([before["median_us"], after["median_us"]])
            base = baselines["eager"]
            doubted = None if fresh else self._doubted(candidate, baselines)
            why = None if fresh else \
                (f"eager took {before['median_us']:.1f} and {after['median_us']:.1f} us around the candidate, "
                 f"{base['median_us']:.1f} us in the cached baseline timing"
                 if stale(base, before, after, cfg.baseline_tolerance) else doubted)
            if why:
                record["source"] = "measured now"
                record["remeasured_because"] = why
                (baselines, settle), fresh = self._measure(baseline_key, ref, record), True
                if doubted and self._doubted(candidate, baselines) and self.store.get("baselines", baseline_key):
                    baselines["compile_confirmed"] = True  # slower than eager twice: believed from now on
                    self.store.put("baselines", baseline_key, baselines)
            problems = []
            rewards = self._rewards(candidate, baselines, [before, after])
            if len(rewards) > 1:
                problems.append(f"eager took {before['median_us']:.1f} us before the candidate, "
                                f"{after['median_us']:.1f} us after and {baselines['eager']['median_us']:.1f} us in "
                                f"the baseline timing: enough to change the reward ({sorted(rewards)})")
            moved = unsettled(baselines, settle, cfg.baseline_tolerance)
            if moved:  # torch.compile's time may be too long by as much as eager moved
                times = (settle["median_us"], baselines["eager"]["median_us"])
                record["unsettled"] = moved
                if len(self._rewards(candidate, baselines, [], (min(times) / max(times),))) > 1:
                    problems.append(f"{moved}: enough, in torch.compile's timing, to change the reward")
            problems += [f"{name}: the GPU was shared ({stats['gpu_shared']})" for name, stats in
                         (("the candidate's timing", candidate), ("eager before it", before), ("eager after it", after),
                          ("eager's baseline timing", baselines["eager"]),
                          ("torch.compile's baseline timing", baselines["compile"] or {}))
                         if stats.get("gpu_shared")]
            if own_spread(candidate) > cfg.max_spread:
                problems.append(f"the candidate's timings spread {own_spread(candidate):.0%} of their median beyond "
                                f"the clock's own spread (limit {cfg.max_spread:.0%})")
            record["problems"] = problems
            if not problems:
                break
        else:
            record["status"] = "too_noisy"
        record["seconds"]["candidate"] -= record["seconds"]["call_checks"]  # its checked calls counted apart
        record["seconds"] = {k: round(t, 3) for k, t in record["seconds"].items()}
        return TimingOutcome(baselines, candidate, record)

    def _doubted(self, candidate: dict[str, Any], cached: dict[str, Any]) -> str | None:
        """Why a cached torch.compile time is not believed where a reward 3 rests on it: slower than the cached eager
        beyond the tolerance (a slowdown that lasted exactly torch.compile's timing escapes the check after it; red
        team 2026-12-06: cached at 6,001 us beside eager's 4,699, its real time ~1,400, and every later candidate
        that beat eager read reward 3). Timed again, a torch.compile truly slower than eager stands."""
        compiled, eager = cached["compile"], cached["eager"]
        if compiled is None or cached.get("compile_confirmed") or \
                compiled["median_us"] <= eager["median_us"] * (1 + self.config.baseline_tolerance):
            return None
        if self._rewards(candidate, cached, []) != {3}:  # (only a reward 3 rests on torch.compile's time)
            return None
        return (f"the cached torch.compile time ({compiled['median_us']:.1f} us) is slower than the cached eager "
                f"({eager['median_us']:.1f} us), and the reward rests on it")

    def _eager_check(self, ref: RefCall, record: dict[str, Any]) -> dict[str, Any]:
        with seconds_in(record, "eager_checks"):
            return ref({"command": "time_eager", "timing": self.check_timing()}, "eager_timed")["stats"]

    def _rewards(self, candidate: dict[str, Any], baselines: dict[str, Any], checks: list[dict],
                 compile_scales: tuple[float, ...] = ()) -> set[int]:
        """The rewards the candidate would get with each eager timing of this evaluation (and torch.compile's time
        scaled by each of `compile_scales`): one value when the machine's noise cannot change the outcome."""
        t = candidate["median_us"]
        t_compile = (baselines["compile"] or baselines["eager"])["median_us"]
        return {milestone_reward(True, t, e["median_us"], t_compile * scale, self.config.speedup_threshold)
                for e in [baselines["eager"], *checks] for scale in (1.0, *compile_scales)}

    def _measure(self, key: str, ref: RefCall, record: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The baselines, and eager timed again right after them; they are cached when the GPU was not shared and
        both eager timings agree."""
        with seconds_in(record, "baselines"):
            msg = ref({"command": "time"}, "baselines")
        baselines = {"eager": msg["eager"], "compile": msg["compile"], "compile_error": msg["compile_error"]}
        after = self._eager_check(ref, record)
        if not shared(baselines) and not unsettled(baselines, after, self.config.baseline_tolerance):
            self.store.put("baselines", key, baselines)
        return baselines, after

    def time_in_worker(self, worker: WorkerProcess, deadline: float, check_call: CheckCall,
                       record: dict[str, Any]) -> dict[str, Any]:
        """The candidate worker's own timing loop (the cuda backend's in-process clock), served call by call: a fresh
        seed before each; after a timed call, its outputs if it is one of the calls drawn (`draw_checks`) once the
        number of timed calls is known (the worker only learns it after the call ran)."""
        rng = secrets.SystemRandom()
        worker.send({"command": "time"})
        seeds: dict[int, int] = {}
        checks: set[int] | None = None
        planned = timed = 0
        previous: int | None = None
        while True:
            msg = worker.receive(deadline)
            if msg.get("event") == "timed":
                break
            if msg.get("event") != "call":
                raise TimingFailed(msg.get("error", f"timing failed: unexpected message {str(msg)[:200]}"))
            if checks is not None and previous in checks:
                worker.send({"export": True})
                exported = worker.receive(deadline)
                if exported.get("event") != "exported" or exported.get("call") != previous:
                    raise TimingFailed(exported.get("error", "timing failed: the outputs of a timed call were not "
                                                             "handed over"))
                record["checked_calls"].append(previous)
                with seconds_in(record, "call_checks"):
                    ok = check_call(seeds[previous], f"timed call {previous} (fresh values in the timed buffers)",
                                    exported)
                if not ok:
                    raise TimingFailed("")  # the verdict already says why
            call = msg.get("call")
            if call is None:
                worker.send({"seed": None})
                continue
            if not isinstance(call, int) or call in seeds:
                raise TimingFailed(f"timing failed: call {call!r} announced twice")
            if msg.get("timed"):
                if checks is None:  # the first timed call: how many follow is known now
                    planned = int(msg.get("planned") or 0)
                    if not self.config.min_iters <= planned <= self.config.max_iters:
                        raise TimingFailed(f"timing failed: {planned} timed calls planned")
                    checks = draw_checks(rng, call, planned, self.config.timed_check_bits)
                timed += 1
            seeds[call] = rng.randrange(2**31)
            previous = call
            worker.send({"seed": seeds[call]})
        stats = msg["stats"]
        if isinstance(msg.get("memory_peak"), int):  # as the candidate says: for scheduling only (memory_budget.py)
            record["candidate_memory_peak"] = max(0, msg["memory_peak"])
        violations = stats.pop("violations", [])
        if violations:
            raise TimingFailed(f"policy violation: {violations[0]}", violations)
        if not stats.get("iters") == timed == planned:
            raise TimingFailed(f"timing failed: {stats.get('iters')} timed calls reported, {timed} prepared, "
                               f"{planned} planned")
        return stats
