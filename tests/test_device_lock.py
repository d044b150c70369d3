"""The device lock: shared work side by side, exclusive work alone, and a waiting exclusive holder goes first."""

import threading
import time

from cuda_agent.judge.device_lock import DeviceLock


def test_shared_holders_overlap_but_never_with_an_exclusive_one():
    lock, guard = DeviceLock(), threading.Lock()
    active = {"shared": 0, "exclusive": 0, "max_shared": 0, "overlap": False}

    def use(kind: str) -> None:
        with getattr(lock, kind)():
            with guard:
                active[kind] += 1
                active["max_shared"] = max(active["max_shared"], active["shared"])
                active["overlap"] |= active["exclusive"] > 1 or (active["exclusive"] and active["shared"])
            time.sleep(0.05)
            with guard:
                active[kind] -= 1

    threads = [threading.Thread(target=use, args=(k,)) for k in ["shared"] * 4 + ["exclusive"] * 3 + ["shared"] * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not active["overlap"] and active["max_shared"] >= 2


def test_a_waiting_exclusive_holder_is_not_starved_by_new_shared_work():
    lock, order = DeviceLock(), []
    first = threading.Event()

    def shared(name: str, hold: float) -> None:
        with lock.shared():
            first.set()
            time.sleep(hold)
            order.append(name)

    def exclusive() -> None:
        with lock.exclusive():
            order.append("exclusive")

    a = threading.Thread(target=shared, args=("a", 0.3))
    a.start()
    first.wait(5)
    e = threading.Thread(target=exclusive)
    e.start()
    time.sleep(0.1)  # the exclusive holder now waits for `a`
    b = threading.Thread(target=shared, args=("b", 0.0))
    b.start()
    for t in (a, e, b):
        t.join(10)
    assert order == ["a", "exclusive", "b"]


def test_the_lock_says_how_the_device_time_went():
    """A shared holder running while an exclusive one waits is draining time: the device runs only the stragglers."""
    lock = DeviceLock()
    holding = threading.Event()

    def shared() -> None:
        with lock.shared():
            holding.set()
            time.sleep(0.3)

    straggler = threading.Thread(target=shared)
    straggler.start()
    holding.wait(5)
    time.sleep(0.1)  # shared alone for 0.1 s, then an exclusive holder waits 0.2 s for it
    with lock.exclusive():
        time.sleep(0.2)
    straggler.join(5)
    time.sleep(0.1)
    s = lock.seconds()
    assert 0.07 <= s["shared"] <= 0.2 and 0.15 <= s["draining"] <= 0.3 and 0.18 <= s["exclusive"] <= 0.35, s
    assert s["free"] >= 0.09 and abs(sum(s.values()) - 0.7) < 0.15, s
