"""The candidate worker's Guard: CPU time of threads started after it (alive or ended) is the candidate's; the
harness's own threads, however busy, are not."""

import os
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from cuda_agent.backend import get_backend
from cuda_agent.judge.candidate.candidate_worker import Guard, TimedCalls
from cuda_agent.judge.wire.process import WorkerFailure


def burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def spin(stop: threading.Event) -> None:
    while not stop.is_set():
        burn(0.001)


def test_the_guard_charges_candidate_threads_alive_or_ended_and_never_the_harness():
    stop = threading.Event()
    harness = threading.Thread(target=spin, args=(stop,), name="harness-pool")
    harness.start()  # before the Guard: one of the harness's threads
    try:
        guard = Guard()
        start = guard.mark()
        time.sleep(0.05)
        busy, threads = guard.busy_us(start)
        assert busy < 5_000 and threads == {}, busy  # the harness thread spun all along

        ended = threading.Thread(target=burn, args=(0.03,), name="short-lived")
        ended.start()
        ended.join()
        gone = time.monotonic() + 5  # join() returns before the kernel lets go of the thread's task entry
        while os.path.exists(f"/proc/self/task/{ended.native_id}") and time.monotonic() < gone:
            time.sleep(0.005)
        busy, threads = guard.busy_us(start)
        assert busy >= 25_000 and threads == {}, busy  # ended before anyone looked: still counted

        again = guard.mark()
        burnt, done = threading.Event(), threading.Event()
        alive = threading.Thread(target=lambda: (burn(0.03), burnt.set(), done.wait()), name="lingering")
        alive.start()
        assert burnt.wait(10)  # (a loaded machine may give it its 30 ms of CPU over much longer than that)
        busy, threads = guard.busy_us(again)
        assert busy >= 25_000 and list(threads) == [str(alive.native_id)], (busy, threads)
        failure = guard._fail("timed call 3", busy, "after forward returned (10 us)", threads)
        assert f"thread {alive.native_id} (" in str(failure) and "timed call 3" in str(failure)
        done.set()
        alive.join()
    finally:
        stop.set()
        harness.join()


class SlowJudge:
    """The judge's side of the timing handshake, taking 50 ms per reply (an export, a busy machine)."""

    def __init__(self):
        self.seeds = iter(range(100))

    def send(self, event, **payload):
        pass

    def receive(self):
        time.sleep(0.05)
        return {"seed": next(self.seeds)}


def test_a_thread_that_waits_out_the_watch_after_a_call_and_works_before_the_next_is_seen():
    """The watch after a call ends after 2 ms when no candidate thread is runnable; a thread that sleeps past it
    and computes while the judge exchanges messages with the worker (before the next call is prepared) must be
    seen: the watch goes on from the end of one call's watch to the start of the next call."""
    guard = Guard()
    cand = SimpleNamespace(chan=SlowJudge(), req={"timing": {"warmup": 1}}, guard=guard, device="cpu",
                           backend=get_backend("cpu"), task=SimpleNamespace(get_inputs=lambda: [torch.ones(4)]))
    hooks = TimedCalls(cand, None)
    for call in (0, 1):  # a warm-up call, then the first timed one: no work outside them
        hooks.before(call)
        hooks.ready(call)
        hooks.after(call, 50.0)
    hooks.before(2)
    hooks.ready(2)
    late = threading.Thread(target=lambda: (time.sleep(0.02), burn(0.005)), name="late")
    late.start()  # call 2 starts it; it sleeps (not runnable) through the 2 ms watch after the call
    # On a loaded machine the watch after call 2 may itself oversleep into the thread's work and catch it there;
    # either way the work must be seen before call 3 is timed.
    with pytest.raises(WorkerFailure, match="timed call [23]: threads of the candidate computed for"):
        hooks.after(2, 50.0)
        hooks.before(3)  # the 50 ms handshake: the thread works in it
        late.join()
        hooks.ready(3)
    late.join()
