"""The trusted path (`backend.trusted_clock`): the reference worker drives and measures every call.

The candidate's worker is connected to the reference worker by a socket of their own; the reference worker stops
the candidate's process at once and resumes it only inside its calls, draws every call's inputs into the
candidate's buffers, keeps the clock and reads the outputs back from the candidate's memory (`trusted/`). Every
check and every timed call is the same kind of call; which timed calls are checked is drawn after they ran.
"""

from __future__ import annotations

import math
import secrets
import socket
import time
from typing import Callable

from .timekeeper import TimingFailed
from .trusted.freezer import split_worker
from .trusted.reference_worker import SCALE_MAX
from .verification import Errors, Verification
from .wire.call_protocol import STATE_DICT_FINDING
from .wire.process import WorkerDied
from .wire.trusted_commands import Attach, CandidateChecked, Check, Detach, TimeCandidate

READ_LIMIT = 16 << 30  # bytes the trusted side reads of one output at most


class TrustedPath(Verification):
    def attach(self) -> bool:
        """Hand the candidate's worker to the reference worker; False when the candidate left processes running."""
        worker = self.ev.worker
        found, launchers, strays = split_worker(worker.proc.pid, worker.sandbox is not None)
        if strays:
            self.verdict.error = "the candidate left processes running after ModelNew was built: all work must " \
                                 "happen in forward"
            return False
        cgroup = worker.sandbox.cgroup.dirs[0] if worker.sandbox and worker.sandbox.cgroup else None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with ours, theirs:
            worker.send_fds([theirs.fileno()])
            worker.send({"command": "serve"})
            self.ev.ref.send_fds([ours.fileno()])
            own = str(self.ev.slot.run_dir / "build") if self.cfg.policy == "strict" else None
            attached = self.ev.ref.ask(Attach(found, launchers, str(cgroup) if cgroup else None, READ_LIMIT, own),
                                       self.cfg.reference_timeout_s)
        self.scales = attached.scales  # whether every call's inputs are scaled by a factor drawn for it
        return True

    def verify(self, deadline: float) -> bool:
        """Every input set, drawn, run and compared by the reference worker: the first at the task's own scale, the
        others (where the task holds there) scaled by a factor drawn for each, like every timed call's. Under the
        kernelbench policy its own trials decide (unscaled, KernelBench's seeds and rule); the extra shape and the
        scaled values run after the timing (`finish`) and only add to `strict_findings`."""
        verdict = self.verdict
        errors: Errors = {"candidate": [], "eager": []}
        self.errors = errors  # the timed calls' checks add theirs (`time_candidate`, then `finish`)
        verdict.max_abs_error = verdict.max_rel_error = 0.0
        lenient = self.cfg.policy == "kernelbench"
        plan = [(f"input set {k}", seed, None, self._scale() if self.scales and k and not lenient else None, False)
                for k, seed in enumerate(self.ev.seeds)]
        extras = []
        shapes = self.extra_shape()
        if shapes:
            extras.append((self.extra_label(shapes), secrets.randbelow(2**31), shapes, None, False))
        if self.cfg.scaled_inputs:
            label, seed, scale = self.scaled_check()
            extras.append((label, seed, None, scale, False))
        if lenient and self.ev.weights and not any(f.startswith(STATE_DICT_FINDING) for f in verdict.strict_findings):
            # strict loads Model's state dict into ModelNew: weights ignored after construction fail there (last:
            # the candidate's weights change)
            extras.append(("weights loaded after construction (strict's state dict)", secrets.randbelow(2**31),
                           None, None, True))
        self.extras = extras if lenient else []
        for label, seed, sizes, scale, reload in plan + ([] if lenient else extras):
            reply = self._check(label, seed, sizes, scale, deadline, reload)
            if reply is None:
                continue
            if not reply.ok:
                verdict.error = self.call_failure(reply.failed, reply.reason)
                return False
            verdict.max_abs_error = max(verdict.max_abs_error or 0.0, reply.max_abs)
            verdict.max_rel_error = max(verdict.max_rel_error or 0.0, reply.rel)
            errors["candidate"] += reply.rel64
            errors["eager"] += reply.eager_rel64
        return self.precision(errors)

    def _check(self, label: str, seed: int, sizes: dict[str, int] | None, scale: float | None,
               deadline: float, reload: bool = False) -> CandidateChecked | None:
        """One input set checked (None: the reference does not hold there; the verdict warns)."""
        reply = self.ev.ref.ask(Check(seed, sizes, scale, label, max(0.0, deadline - time.monotonic()), reload),
                                self.cfg.reference_timeout_s)
        if reply.skipped is not None:
            self.verdict.warnings.append(f"{label} skipped: the reference fails there ({reply.skipped})")
            return None
        self.verdict.phases_s["verify_candidate"] = round(self.verdict.phases_s.get("verify_candidate", 0.0)
                                                          + reply.call_us / 1e6, 3)
        self.verdict.strict_findings += reply.findings
        return reply

    def strict_extras(self) -> bool:
        """The kernelbench policy's extra checks, after the timing: each failure a finding. False when one ended the
        candidate's process (nothing more can be asked of it)."""
        deadline = self.ev.until(self.cfg.run_timeout_s)
        for label, seed, sizes, scale, reload in self.extras:
            reply = self._check(label, seed, sizes, scale, deadline, reload)
            if reply is not None and not reply.ok:
                self.verdict.strict_findings.append(self.call_failure(reply.failed, reply.reason))
                if reply.failed:
                    return False
        return True

    def time_candidate(self, deadline: float) -> Callable[[dict], dict]:
        def time_candidate(record: dict) -> dict:
            reply = self.ev.ref.ask(TimeCandidate(self.ev.judge.timing(), self.cfg.timed_check_bits,
                                                  max(0.0, deadline - time.monotonic())), self.cfg.reference_timeout_s)
            if not reply.ok or reply.stats is None:
                self.verdict.correct = False
                raise TimingFailed(self.call_failure(reply.failed, reply.reason))
            record["checked_calls"] += reply.stats.pop("checked_calls")
            record["wrong_timed_calls"] = record.get("wrong_timed_calls", 0) + reply.stats.pop("wrong_timed_calls", 0)
            self.errors["candidate"] += reply.stats.pop("rel64", [])  # the checked timed calls' (held out: a kernel
            self.errors["eager"] += reply.stats.pop("eager_rel64", [])  # exact on the first calls only)
            self.verdict.strict_findings += reply.stats.pop("findings", [])
            record["candidate_memory_peak"] = reply.stats.pop("memory_peak")  # the kernel's, for scheduling
            return reply.stats

        return time_candidate

    def finish(self) -> None:
        if not self.precision(self.errors):  # again, over the checked timed calls' errors too
            raise TimingFailed(self.verdict.error)
        if not self.strict_extras():  # (kernelbench) the audits' answer went with the process: findings only
            self.verdict.strict_findings.append("the in-process audits' results were lost with the process")
            return
        reply = self.ev.ref.ask(Detach(end=True), self.cfg.reference_timeout_s)
        if reply.error:
            raise TimingFailed(self.call_failure(reply.failed, reply.error))
        if reply.violations:
            raise TimingFailed(f"policy violation: {reply.violations[0]}", reply.violations)

    def close(self) -> None:
        """A candidate that failed stays stopped until it is killed (a no-op after `finish`)."""
        self.ev.ref.ask(Detach(), self.cfg.reference_timeout_s)

    def call_failure(self, how: str | None, reason: str) -> str:
        """The reason for a failed call: how the candidate's process died or that it was killed at its deadline, or
        what the trusted side found."""
        worker = self.ev.worker
        if how == "timeout":
            worker.kill()
            return f"candidate process timed out after {time.monotonic() - worker.started:.0f}s (killed)"
        if how == "ended":
            try:
                worker.receive(time.monotonic() + 10)
            except WorkerDied as exc:
                return f"candidate process {exc}"
        return f"ModelNew.forward failed: {reason}" if how and not reason.startswith(("incorrect", "invalid")) \
            else reason

    @staticmethod
    def _scale() -> float:
        return math.exp(secrets.randbelow(10**6) / 10**6 * math.log(SCALE_MAX))
