"""`--timing kernelbench`: KernelBench's own timing beside the judge's, for numbers comparable with published ones.

KernelBench times `ModelNew` with CUDA events recorded in the process that runs it (`kernelbench.time_calls`: its
warm-ups, trials, discarded first trial and L2 flush, or the first release's loop without them). Here that process
is the candidate's, so what it reports is only as honest as the candidate: a kernel that rewrites its own process
can make it say anything. It therefore decides nothing: the reward and the verdict's speedups come from the judge's
clock alone, and this measurement goes into `verdict.kernelbench_timing`, labelled as the candidate's own.

It runs after a correct candidate was timed, in a fresh candidate worker of the same run folder (the judged one was
stopped by the trusted side or is spent; its builds are cached), with no op audit and the task's `get_inputs()` from
seed 42 as KernelBench's are; the reference worker times `Model` eager and under `torch.compile` (inductor, default
mode: KernelBench's baseline) the same way. Both run with the device to this evaluation alone.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from . import kernelbench
from .references import ReferenceFailed
from .wire.process import WorkerDied

if TYPE_CHECKING:
    from .evaluation import Evaluation

WHERE = ("KernelBench's method, in the candidate's own process (its report can be fooled by the candidate; no "
         "verdict or reward uses it)")


def plausible(times: Any, trials: int) -> bool:
    """Trial times as the candidate's process reports them: `trials` (at least one) positive finite numbers."""
    return isinstance(times, list) and 0 < len(times) <= max(1, trials) and all(
        type(t) in (int, float) and math.isfinite(t) and t > 0 for t in times)


def measure(ev: Evaluation) -> dict[str, Any]:
    """KernelBench's timing of the candidate and of both baselines: means in ms, speedups, or why it failed."""
    method = kernelbench.TIMINGS[ev.cfg.timing]
    record: dict[str, Any] = {"method": method.name, "revision": method.revision, "measured": WHERE,
                              "warmup": method.warmup, "trials": method.trials,
                              "discard_first": method.discard_first, "l2_flush": method.flush_l2}
    try:  # whatever fails here is reported here: the verdict is made already
        candidate = second_worker(ev)
        if "error" in candidate:
            return {**record, "error": candidate["error"]}
        with ev.judge.device_lock.exclusive():
            ev.worker.send({"command": "kernelbench_time", "method": method.name})
            timed = ev.worker.receive(ev.until(ev.cfg.run_timeout_s))
            if timed.get("event") != "kernelbench_timed" or "ms" not in timed:
                return {**record, "error": f"the candidate failed KernelBench's timing: {timed.get('error', timed)}"}
            if not plausible(timed["ms"], method.trials):  # (its own report: a list of positive finite times)
                return {**record, "error": f"the candidate reported {str(timed['ms'])[:100]} as its {method.trials} "
                                           "trial times in ms"}
            ref = ev.ref.call({"command": "kernelbench_time", "method": method.name}, "kernelbench_timed",
                              ev.cfg.reference_timeout_s)
    except WorkerDied as exc:
        return {**record, "error": f"candidate process {exc}"}
    except ReferenceFailed as exc:
        return {**record, "error": f"the reference failed KernelBench's timing: {exc}"}
    except (KeyError, TypeError, ValueError) as exc:  # an answer of the candidate's process not shaped as ours
        return {**record, "error": f"the candidate's answer to KernelBench's timing: {type(exc).__name__}: {exc}"}
    stats = {"candidate": kernelbench.timing_stats(timed["ms"]), "eager": kernelbench.timing_stats(ref["eager"]),
             "compile": kernelbench.timing_stats(ref["compile"]) if ref.get("compile") else None}
    record.update({f"{name}_ms": s["mean"] if s else None for name, s in stats.items()})
    record["stats_ms"] = stats
    record["compile_error"] = ref.get("compile_error")
    for base in ("eager", "compile"):
        ms = record[f"{base}_ms"]
        record[f"speedup_vs_{base}"] = ms / record["candidate_ms"] if ms and record["candidate_ms"] else None
    return record


def second_worker(ev: Evaluation) -> dict[str, Any]:
    """A fresh candidate worker in the evaluation's run folder, loaded and initialised as KernelBench builds
    `ModelNew` (the judged worker is closed first): `{}` when it is ready (`ev.second_worker`), else
    `{"error": ...}`."""
    slot = ev.slot
    slot.worker.close()
    slot.worker = ev.worker = ev.judge._start_candidate(slot.run_dir)
    ev.worker.send({"request": ev.candidate_request(audit_ops=False, trusted_inputs=False)})
    for expected, command in (("loaded", None), ("initialised", {"command": "init",
                                                                  "public_dir": str(slot.run_dir / "public")})):
        if command:
            ev.worker.send(command)
        msg = ev.serve_builds([])
        if msg.get("event") != expected:
            return {"error": f"the candidate's second process failed: {msg.get('error', msg)}"}
    ev.second_worker = True
    return {}
