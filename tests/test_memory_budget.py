"""The device memory budget: evaluations admitted while their tasks' known needs fit, in order of arrival."""

import threading
import time

from cuda_agent.backend import CpuBackend, CudaBackend
from cuda_agent.judge.memory_budget import SHARE, MemoryBudget, evaluation_need


def hold_in_thread(budget, need, log, name, seconds=0.2):
    def run():
        with budget.hold(need):
            log.append((name, "in"))
            time.sleep(seconds)
            log.append((name, "out"))

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_needs_are_admitted_while_they_fit_in_order_of_arrival():
    budget, log = MemoryBudget(), []
    budget.learn(100 / SHARE)  # 100 bytes to promise
    threads = [hold_in_thread(budget, 60, log, "a")]
    time.sleep(0.05)
    threads.append(hold_in_thread(budget, 60, log, "big"))  # does not fit beside a: waits
    time.sleep(0.05)
    threads.append(hold_in_thread(budget, 10, log, "small"))  # would fit, but arrived after big: waits its turn
    threads.append(hold_in_thread(budget, 0, log, "unknown"))  # a task never judged: promises nothing, waits not
    for t in threads:
        t.join(5)
    assert log.index(("unknown", "in")) < log.index(("a", "out"))
    assert log.index(("a", "out")) < log.index(("big", "in")) < log.index(("small", "in")) < log.index(("big", "out"))


def test_what_idle_warm_reference_workers_may_keep_is_not_promised_to_evaluations():
    gb = 2**30
    budget = MemoryBudget(kept_idle=16 * gb)  # the judge's default warm_memory_gb
    budget.learn(80 * gb)  # an H100
    assert budget.capacity == SHARE * 80 * gb - 16 * gb
    budget.learn(20 * gb)  # a device smaller than that: half the share still goes to evaluations
    assert budget.capacity == SHARE * 20 * gb / 2


def test_a_need_larger_than_the_device_is_admitted_alone():
    budget, log = MemoryBudget(), []
    budget.learn(100 / SHARE)
    threads = [hold_in_thread(budget, 30, log, "a"), hold_in_thread(budget, 500, log, "huge")]
    for t in threads:
        t.join(5)
    assert log[:2] == [("a", "in"), ("a", "out")] and log[2:] == [("huge", "in"), ("huge", "out")], log


def test_a_task_never_judged_is_guessed_from_its_weights_and_inputs_drawn_without_memory():
    from pathlib import Path

    from cuda_agent.judge.trusted.reference_worker import GUESS, Reference
    from cuda_agent.judge.wire.tensors import tensor_bytes

    task = Path(__file__).parent / "data" / "tasks" / "linear_gelu.py"  # a Linear: weights and inputs
    ref = Reference({"backend": "cpu", "allow_tf32": False, "task_path": str(task), "init_seed": 0})
    weights = tensor_bytes(list(ref.model.parameters()))
    assert weights > 0 and ref.memory_guess() == GUESS * (weights + tensor_bytes(ref.module.get_inputs()))
    ref.module.get_inputs = lambda: [__import__("torch").ones(3).numpy()]  # cannot be drawn on the meta device
    assert ref.memory_guess() == 0


def test_an_evaluation_promises_its_processes_contexts_beside_its_task_s_need():
    """Sixteen evaluations of a task judged before, on an 80 GB GPU: each promises its reference's and a candidate's
    peaks and its three processes' CUDA contexts, so fewer run at once than the peaks alone would let in (on the
    H100 they did, and reference workers died of "out of memory" creating memory)."""
    gb = 1 << 30
    assert CpuBackend.process_memory == 0 and CudaBackend.process_memory >= 512 << 20
    contexts = 3 * CudaBackend.process_memory
    known = {"peak": 2.5 * gb, "candidate": gb, "total": 80 * gb}
    assert evaluation_need({}, contexts) == 0  # never judged: its guess is held later, with the contexts
    assert evaluation_need({"peak": 2 * gb}, contexts) == 4 * gb + contexts  # no candidate said: as much again
    budget, lock, inside = MemoryBudget(), threading.Lock(), []
    budget.learn(known["total"])

    def evaluation():
        with budget.hold(evaluation_need(known, contexts)):
            with lock:
                inside.append(1)
                most.append(len(inside))
            time.sleep(0.05)
            with lock:
                inside.pop()

    most: list[int] = []
    threads = [threading.Thread(target=evaluation) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    data = known["peak"] + known["candidate"]
    assert 16 * data <= SHARE * known["total"]  # the peaks alone would have let all sixteen in
    assert len(most) == 16 and max(most) * (data + contexts) <= SHARE * known["total"] and max(most) < 16, most


def test_an_evaluation_s_wait_for_memory_is_its_own_phase_not_its_build_s(cache_dir):
    """A task judged before waits for its known need before anything else: `memory_queued` holds that wait and the
    build's phase starts after it (the ninth recipe attempt's verdicts counted the wait twice, in both)."""
    from conftest import CANDIDATES, TASKS, fast_config
    from cuda_agent.judge import Judge

    with Judge("cpu", fast_config(cache_dir)) as judge:
        judge.evaluate(TASKS / "affine_relu.py", CANDIDATES / "affine_relu_ok")  # its memory learnt, its build cached
        entered = threading.Event()

        def hog():
            with judge.memory.hold(judge.memory.capacity):
                entered.set()
                time.sleep(3.0)
        thread = threading.Thread(target=hog)
        thread.start()
        entered.wait()
        verdict = judge.evaluate(TASKS / "affine_relu.py", CANDIDATES / "affine_relu_ok")
        thread.join()
    assert verdict.correct, verdict.error
    assert verdict.phases_s["memory_queued"] >= 2.5 > verdict.phases_s["build"], verdict.phases_s  # (a cached build)
