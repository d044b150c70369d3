"""The device memory budget: evaluations admitted while their tasks' known needs fit, in order of arrival."""

import threading
import time

from cuda_agent.judge.memory_budget import SHARE, MemoryBudget


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
