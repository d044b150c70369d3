"""Device memory promised to the evaluations in flight, so that many at once do not run the device out of memory.

A task's need is learnt from its earlier evaluations: the most its reference worker held, plus the most a timed
candidate of it said it held (as much as the reference where none was timed yet), plus what the evaluation's
processes hold before they allocate anything (their CUDA contexts: three processes on the GPU's trusted path, ~2 GB,
which sixteen evaluations in flight made more than the share left unpromised). What a candidate says only
schedules: one that says too little can run others out of memory, and they are judged again alone (`pool.py`). A
task never judged here promises its reference worker's guess (a multiple of its weights and one input set,
`reference_worker.GUESS`) from its first device phase to the verdict. Evaluations are admitted in order of
arrival, so a large task is not passed over forever; one larger than the device is admitted when nothing else
holds any.
"""

from __future__ import annotations

import threading
from collections import deque
from contextlib import contextmanager
from typing import Iterator

SHARE = 0.8  # of the device's memory, less what idle warm reference workers may keep: the rest for spare workers'
# contexts and the process that runs the judge (a policy beside it, in training)


def evaluation_need(known: dict, contexts: float) -> float:
    """What an evaluation of a task judged here before promises (`known`: the store's record of it): the most its
    reference held, a candidate's most (as much again where none said), and its processes' `contexts`; 0 for a task
    never judged here (its guess is held from its first device phase, with the contexts)."""
    if not known:
        return 0.0
    return known.get("peak", 0) + known.get("candidate", known.get("peak", 0)) + contexts


class MemoryBudget:
    def __init__(self, kept_idle: float = 0.0) -> None:
        """`kept_idle`: the bytes idle warm reference workers may keep (JudgeConfig.warm_memory_gb), not promised
        to evaluations: on an 80 GB H100 the share's remaining 20% did not cover them beside sixteen evaluations
        (in 46 of the ninth recipe attempt's 238 verdicts a reference worker died; 10 said out of memory, the
        others gave no reason)."""
        self.kept_idle = kept_idle
        self.capacity = float("inf")  # bytes; known once a reference worker has said how much the device has
        self._used = 0.0
        self._queue: deque[object] = deque()
        self._cond = threading.Condition()

    def learn(self, device_total: int) -> None:
        with self._cond:  # (at least half the share: a small device keeps fewer idle workers' memory in practice)
            self.capacity = max(SHARE * device_total - self.kept_idle, SHARE * device_total / 2)
            self._cond.notify_all()

    @contextmanager
    def hold(self, need: float) -> Iterator[None]:
        """Wait until `need` bytes fit beside what the evaluations in flight were promised, and keep them."""
        if need <= 0:
            yield
            return
        ticket = object()
        with self._cond:
            self._queue.append(ticket)
            self._cond.wait_for(lambda: self._queue[0] is ticket and
                                (self._used == 0 or self._used + need <= self.capacity))
            self._queue.popleft()
            self._used += need
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._used -= need
                self._cond.notify_all()
