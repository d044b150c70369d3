"""The judge pool: many evaluations at once, each device's verification and timing one at a time, verdicts as a
lone judge gives them."""

import json
import sqlite3
import threading
import time
from contextlib import contextmanager

import pytest
import torch

from conftest import CANDIDATES, TASKS, fast_config
from cuda_agent.judge import Judge, Verdict, references
from cuda_agent.judge.device_lock import DeviceLock
from cuda_agent.judge.pool import JudgePool
from cuda_agent.judge.store import Store
from cuda_agent.task import load_task

AFFINE = TASKS / "affine_relu.py"


class CountingLock(DeviceLock):
    """A device lock that remembers how many exclusive holders it ever had at once."""

    def __init__(self):
        super().__init__()
        self._count = threading.Lock()
        self.holders = self.most = self.entries = 0

    @contextmanager
    def exclusive(self):
        if self._owned():  # the holder entering again: not another holder
            yield
            return
        with super().exclusive():
            with self._count:
                self.holders += 1
                self.entries += 1
                self.most = max(self.most, self.holders)
            try:
                yield
            finally:
                with self._count:
                    self.holders -= 1


def test_the_pool_judges_at_once_one_device_phase_at_a_time_as_a_lone_judge_would(cache_dir, make_workspace):
    wrong = make_workspace(edits={"kernels/affine_relu.cpp": [("* 0.5f;", "* 0.55f;")]})
    work = [(AFFINE, CANDIDATES / "affine_relu_ok"), (AFFINE, wrong), (AFFINE, CANDIDATES / "affine_relu_single.py"),
            (TASKS / "linear_gelu.py", CANDIDATES / "affine_relu_ok")]
    with Judge("cpu", fast_config(cache_dir)) as judge:
        alone = [judge.evaluate(task, cand) for task, cand in work]
    assert "memory_queued" in alone[0].phases_s  # a task never judged: its reference's guess was promised
    with JudgePool("cpu", fast_config(cache_dir), workers=3) as pool:
        lock = pool.judges[0].device_lock = CountingLock()
        together = [f.result() for f in [pool.submit(task, cand) for task, cand in work]]
    # never two timed runs at once; the wrong candidate fails its verification (under the shared hold) and the last
    # never reaches the device (ModelNew(features) fails before, off the lock)
    assert lock.most == 1 and lock.entries == 2
    for a, b in zip(alone, together):
        assert (a.compiled, a.correct, a.policy_violations, a.task, a.candidate, a.policy) == \
               (b.compiled, b.correct, b.policy_violations, b.task, b.candidate, b.policy)
        assert (a.error or "").split(":")[0] == (b.error or "").split(":")[0]  # inputs are fresh per evaluation
    assert [v.correct for v in together] == [True, False, True, False]
    # the tasks' memory was learnt from the lone judge's evaluations: the pool's are admitted by it
    assert all("memory_queued" in v.phases_s for v in together)
    key = "|".join([load_task(AFFINE).hash, "cpu", torch.__version__])
    learnt = Store(cache_dir / "judge.sqlite").get("memory", key)
    assert 0 < learnt["peak"] < learnt["total"] and 0 < learnt["candidate"] < learnt["total"], learnt


def test_an_evaluation_that_ran_out_of_device_memory_beside_others_is_judged_again_alone(cache_dir, tmp_path):
    single = (CANDIDATES / "affine_relu_single.py").read_text()
    oom = tmp_path / "oom.py"  # out of memory every time: the second verdict, alone, is the one that counts
    oom.write_text(single.replace("        return ext.affine_relu(x, self.scale, self.shift)",
                                  "        raise RuntimeError('CUDA out of memory. Tried to allocate 6.00 GiB')"))
    with JudgePool("cpu", fast_config(cache_dir), workers=2) as pool:
        lock = pool.judges[0].device_lock = CountingLock()
        verdicts = [f.result() for f in [pool.submit(AFFINE, oom), pool.submit(AFFINE, CANDIDATES / "affine_relu_ok")]]
    failed, fine = verdicts
    assert not failed.correct and "out of memory" in failed.error
    assert "ran out of device memory beside other evaluations: judged again alone" in failed.warnings
    assert fine.correct and not any("judged again" in w for w in fine.warnings), fine.error
    # the good one's timing, then the retry holding it from start to end (the first try failed in verification)
    assert lock.most == 1 and lock.entries == 2


def test_an_evaluation_judged_again_alone_waits_for_those_in_flight_and_none_starts_beside_it(cache_dir):
    """Alone means the device's memory is its own too: the evaluations in flight on the device finish first (their
    processes hold memory between their device phases), and one submitted meanwhile waits until it is done."""
    started, lock = [], threading.Lock()
    in_flight = [0]

    class Stub:
        def evaluate(self, task, cand, alone=False, deadline=None):
            with lock:
                in_flight[0] += 1
                started.append((cand, alone, in_flight[0]))
            time.sleep(0.05 if cand == "oom" and not alone else 0.4)
            with lock:
                in_flight[0] -= 1
                started.append((cand, "ended"))
            error = "CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`" if cand == "oom" else None
            return Verdict(reward=-1, compiled=True, correct=error is None, error=error)

        def close(self):
            pass

    with JudgePool("cpu", fast_config(cache_dir), workers=4) as pool:
        pool.judges[0].close()
        pool.judges[0] = Stub()
        futures = [pool.submit(AFFINE, c) for c in ("oom", "a", "b")]
        time.sleep(0.2)  # the first try failed at 0.05 s; its retry waits for a and b
        futures.append(pool.submit(AFFINE, "late"))
        verdicts = [f.result() for f in futures]
    alone_at = started.index(("oom", True, 1))  # nothing else in flight when it began
    assert {("a", "ended"), ("b", "ended")} <= set(started[:alone_at]), started
    assert started[alone_at + 1:] == [("oom", "ended"), ("late", False, 1), ("late", "ended")], started
    assert "judged again alone" in verdicts[0].warnings[-1]
    assert [v.correct for v in verdicts] == [False, True, True, True]


def test_an_evaluation_its_reference_worker_failed_beside_others_is_judged_again_alone(cache_dir):
    """Seen on the H100: a reference worker ran out of memory beside 15 other evaluations, and its second try (the
    judge's own) failed too with words that no longer say why ("exited with code 0"): a correct kernel scored -1.
    An evaluation aborted by its reference worker's failure is judged again alone."""
    calls = []

    class Stub:
        def evaluate(self, task, cand, alone=False, deadline=None):
            calls.append(alone)
            error = None if alone else "evaluation aborted: reference t.py: the reference worker exited with code 0"
            return Verdict(reward=2 if alone else -1, compiled=True, correct=alone, error=error)

        def close(self):
            pass

    with JudgePool("cpu", fast_config(cache_dir), workers=2) as pool:
        pool.judges[0].close()
        pool.judges[0] = Stub()
        verdict = pool.evaluate(AFFINE, "ok")
    assert calls == [False, True] and verdict.correct and verdict.reward == 2
    assert verdict.warnings == ["its reference worker failed beside other evaluations: judged again alone"]


def test_no_evaluation_is_judged_again_alone_past_the_caller_s_deadline(cache_dir):
    """Out of memory beside others, but the caller's deadline (an episode's time limit) has passed: the verdict
    stands, and the deadline reached the judge."""
    calls = []

    class Stub:
        def evaluate(self, task, cand, alone=False, deadline=None):
            calls.append((alone, deadline))
            time.sleep(0.2)
            return Verdict(reward=-1, compiled=True, correct=False, error="CUDA out of memory. Tried to allocate")

        def close(self):
            pass

    with JudgePool("cpu", fast_config(cache_dir), workers=2) as pool:
        pool.judges[0].close()
        pool.judges[0] = Stub()
        deadline = time.monotonic() + 0.1
        verdict = pool.evaluate(AFFINE, "oom", deadline=deadline)
        assert calls == [(False, deadline)] and "out of memory" in verdict.error
        verdict = pool.evaluate(AFFINE, "oom", deadline=time.monotonic() + 60)
        assert [alone for alone, _ in calls] == [False, False, True], calls


class SharedCountingLock(DeviceLock):
    """A device lock that counts its shared holds."""

    def __init__(self):
        super().__init__()
        self.shared_entries = 0

    @contextmanager
    def shared(self):
        with super().shared():
            self.shared_entries += 1
            yield


def test_torch_compile_hands_the_device_back_while_it_compiles(cache_dir, monkeypatch):
    """Where the device is not the CPU, the baseline's compilation (CPU seconds) runs beside timed runs: the
    reference worker holds the device shared for torch.compile's first run but hands it back while dynamo and
    inductor compile, and takes it again to run. On the cpu backend (compiling would disturb its timing) it holds
    the device throughout. (The in-process clock's path, the cuda backend's: there the reference worker compiles.)"""
    shared = {}
    for beside in (False, True):
        cfg = fast_config(cache_dir, target_time_s=0.09 if beside else 0.08)  # its own baselines: compiled afresh
        with Judge("cpu", cfg) as judge:
            monkeypatch.setattr(judge.backend, "compiles_beside_timing", beside)
            monkeypatch.setattr(judge.backend, "trusted_clock", False)
            lock = judge.device_lock = SharedCountingLock()
            verdict = judge.evaluate(AFFINE, CANDIDATES / "affine_relu_ok")
        assert verdict.correct, verdict.error
        shared[beside] = (lock.shared_entries, verdict.phases_s.get("baseline_compile_unlocked", 0.0))
    assert shared[False] == (3, 0.0)  # begin, the compiled run, verification
    entries, unlocked = shared[True]  # and again after each frame compiled
    assert entries >= 4 and 0 < unlocked <= verdict.phases_s["baseline_compile"], (shared, verdict.phases_s)


def test_idle_reference_workers_are_kept_within_count_and_memory(monkeypatch, tmp_path):
    class Stub:
        def __init__(self, task, request, env, root):
            self.task, self.users, self.failed, self.memory, self.closed = task, 0, False, task.memory, False

        def close(self):
            self.closed = True

    class FakeTask:
        def __init__(self, name, memory):
            self.name, self.hash, self.memory = name, name, memory

    monkeypatch.setattr(references, "ReferenceWorker", Stub)
    pool = references.ReferencePool(size=2, root=tmp_path, memory_bytes=10)
    seen = {}
    for name, memory in [("a", 4), ("b", 4), ("c", 4), ("b", 4)]:
        with pool.reserve(FakeTask(name, memory), {}, {}) as worker:
            seen.setdefault(name, worker)
    assert [w.task.name for w in pool.workers.values()] == ["c", "b"]  # b used last; a least recent, gone
    assert seen["a"].closed and not seen["b"].closed
    with pool.reserve(FakeTask("d", 7), {}, {}):  # b and d fit no longer: the older goes
        pass
    assert [w.task.name for w in pool.workers.values()] == ["d"] and seen["b"].closed and seen["c"].closed


def test_an_interrupted_suite_finishes_and_stores_what_is_in_flight_and_starts_nothing_more(cache_dir, tmp_path):
    from cuda_agent.judge.store import Store
    from cuda_agent.suite.evaluate import discover, evaluate_suite

    suite, solutions = tmp_path / "suite" / "level1", tmp_path / "solutions" / "level1"
    suite.mkdir(parents=True)
    solutions.mkdir(parents=True)
    for i in range(1, 5):  # four tasks (same content, distinct solutions: four evaluations)
        (suite / f"{i}_affine.py").write_text(AFFINE.read_text())
        (solutions / f"{i}_affine.py").write_text((CANDIDATES / "affine_relu_single.py").read_text() + f"\n# {i}\n")
    tasks = discover(tmp_path / "suite")
    store, said = Store(tmp_path / "db.sqlite"), []

    def interrupt(task, verdict, resumed):  # Ctrl-C as the first verdict arrives
        if not said:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        with JudgePool("cpu", fast_config(cache_dir), workers=2) as pool:
            evaluate_suite(pool, tasks, tmp_path / "solutions", store, interrupt, said.append)
    with sqlite3.connect(store.path) as db:
        stored = [Verdict.from_dict(json.loads(v)) for (v,) in db.execute("SELECT value FROM entries")]
    assert said and said[0].startswith("interrupted: finishing the") and 2 <= len(stored) <= 3  # the 4th never ran
    assert all(v.correct for v in stored), [v.error for v in stored]  # finished, not aborted


def test_default_workers_grow_with_the_gpus_up_to_the_cores(monkeypatch):
    from cuda_agent.judge import pool

    monkeypatch.setattr(pool.os, "cpu_count", lambda: 32)
    assert [pool.default_workers("cuda", n) for n in (1, 2, 4)] == [16, 32, 32]  # 16 per GPU, the cores at most
    monkeypatch.setattr(pool.os, "cpu_count", lambda: 2)
    assert pool.default_workers("cuda", 2) == 4  # still two per GPU on a small host
    assert pool.default_workers("cpu", 1) == 1  # the cores are the device


def test_each_evaluation_in_flight_gets_its_share_of_the_cores_for_inductors_compile_workers(cache_dir, monkeypatch):
    from cuda_agent.judge import pool

    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    monkeypatch.setattr(pool.os, "cpu_count", lambda: 16)
    with JudgePool("cpu", fast_config(cache_dir), workers=4) as four, JudgePool("cpu", fast_config(cache_dir)) as one:
        assert four.judges[0].worker_env()["TORCHINDUCTOR_COMPILE_THREADS"] == "4"
        assert one.judges[0].worker_env()["TORCHINDUCTOR_COMPILE_THREADS"] == "16"  # alone: all of them
        monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "3")  # the user's setting wins
        assert "TORCHINDUCTOR_COMPILE_THREADS" not in four.judges[0].worker_env()
    assert pool.compile_threads(32) == 1
