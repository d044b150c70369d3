"""The candidate worker's Guard: CPU time of threads started after it (alive or ended) is the candidate's; the
harness's own threads, however busy, are not."""

import threading
import time

from cuda_agent.judge.candidate_worker import Guard


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
        busy, threads = guard.busy_us(start)
        assert busy >= 25_000 and threads == {}, busy  # ended before anyone looked: still counted

        again = guard.mark()
        done = threading.Event()
        alive = threading.Thread(target=lambda: (burn(0.03), done.wait()), name="lingering")
        alive.start()
        time.sleep(0.1)
        busy, threads = guard.busy_us(again)
        assert busy >= 25_000 and list(threads) == [str(alive.native_id)], (busy, threads)
        failure = guard._fail("timed call 3", busy, "after forward returned (10 us)", threads)
        assert f"thread {alive.native_id} (" in str(failure) and "timed call 3" in str(failure)
        done.set()
        alive.join()
    finally:
        stop.set()
        harness.join()
