"""The in-process path: the candidate's worker runs the calls and measures them (the cuda backend, until it has a
trusted clock; docs/threat-model.md says what that leaves open).

Each input set in lockstep: the reference worker draws it from a seed and computes its outputs, the candidate's
worker draws the same set and runs `ModelNew` on it, hands its outputs over in shared memory and reports its
inputs' fingerprints; the reference worker compares. Timing is the candidate worker's loop, a fresh seed before
every call and a few timed calls' outputs checked (`Timekeeper.time_in_worker`).
"""

from __future__ import annotations

import secrets
from typing import Any, Callable

from .verification import Errors, Verification
from .wire.process import close_fds


class InProcessPath(Verification):
    def attach(self) -> bool:
        return True

    def verify(self, deadline: float) -> bool:
        errors: Errors = {"candidate": [], "eager": []}
        self.verdict.max_abs_error = self.verdict.max_rel_error = 0.0
        seeds = self.ev.seeds
        for k, seed in enumerate(seeds):
            if not self._trial({"command": "trial", "k": k, "seed": seed}, f"input set {k}", deadline, errors):
                return False
        shapes = self.extra_shape()
        if shapes:
            command = {"command": "trial", "k": len(seeds), "seed": secrets.randbelow(2**31), "shapes": shapes}
            if not self._trial(command, self.extra_label(shapes), deadline, errors):
                return False
        if self.cfg.scaled_inputs:
            label, seed, scale = self.scaled_check()
            if not self._trial({"command": "trial", "k": len(seeds) + 1, "seed": seed, "scale": scale}, label,
                               deadline, errors):
                return False
        return self.precision(errors)

    def time_candidate(self, deadline: float) -> Callable[[dict], dict]:
        ev = self.ev

        def check(seed: int, label: str, exported: dict) -> bool:
            """The outputs of a timed call the timekeeper picked: the reference redraws its inputs from the seed."""
            ready = ev.ref.call({"command": "trial", "seed": seed, "fp64": False}, "trial_ready",
                                self.cfg.reference_timeout_s)
            if ready["checksums"] is None:
                self.verdict.error = f"incorrect: {label}: the reference failed there ({ready['error']})"
                return False
            ok = self._check_outputs(ready, exported, label, deadline, {"candidate": [], "eager": []})
            if not ok:
                self.verdict.correct = False
            return ok

        return lambda record: ev.judge.timekeeper.time_in_worker(ev.worker, deadline, check, record)

    def finish(self) -> None:
        pass

    def close(self) -> None:
        pass

    def _trial(self, command: dict[str, Any], label: str, deadline: float, errors: Errors) -> bool:
        """One input set: the reference draws it and computes its outputs, the candidate runs on it, the reference
        compares. False on failure (the verdict says why)."""
        ref, worker, verdict = self.ev.ref, self.ev.worker, self.verdict
        ref.send({"command": "trial", "seed": command["seed"], "shapes": command.get("shapes"),
                  "scale": command.get("scale")})
        worker.send(command)
        ready = ref.receive("trial_ready", self.cfg.reference_timeout_s)
        msg = worker.receive(deadline)
        if ready["checksums"] is None:  # the task itself does not hold at these sizes: nothing to check
            verdict.warnings.append(f"{label} skipped: the reference fails there ({ready['error']})")
            return True
        if msg["event"] != "trial_done" or msg.get("failed"):
            verdict.error = msg.get("failed") or msg.get("error", f"unexpected message {str(msg)[:200]}")
            return False
        verdict.warnings = list(dict.fromkeys(verdict.warnings + msg["warnings"]))
        for name, seconds in (("reference", ready["seconds"]), ("candidate", msg["seconds"])):
            verdict.phases_s[f"verify_{name}"] = round(verdict.phases_s.get(f"verify_{name}", 0.0) + seconds, 3)
        return self._check_outputs(ready, msg, label, deadline, errors)

    def _check_outputs(self, ready: dict, msg: dict, label: str, deadline: float, errors: Errors) -> bool:
        """The candidate's report on one call (inputs as it left them, its outputs) against the reference's."""
        try:  # the shared memory holding its outputs, whatever happens next
            fds = self.ev.worker.receive_fds(min(int(msg.get("fds", 0)), 1 << 16), deadline)
        except (OSError, ValueError, TypeError) as exc:
            self.verdict.error = f"invalid output: {label}: the candidate did not hand its outputs over ({exc})"
            return False
        try:
            return self._compare(ready, msg, label, fds, errors)
        finally:
            close_fds(fds)

    def _compare(self, ready: dict, msg: dict, label: str, fds: list[int], errors: Errors) -> bool:
        verdict = self.verdict
        verdict.policy_violations = list(dict.fromkeys(verdict.policy_violations + msg.get("violations", [])))
        expected = ready["checksums"]
        changed = [a.split(":")[0] for a, b in zip(msg["checksums_after"], expected) if a != b]
        if changed or len(msg["checksums_after"]) != len(expected):
            verdict.error = f"incorrect: {label}: {(changed or ['an input'])[0]} was modified in place by " \
                            "ModelNew.forward"
            return False
        if msg["problems"]:
            verdict.error = f"invalid output: {label}: {msg['problems'][0]}"
            return False
        if verdict.policy_violations:
            verdict.error = f"policy violation: {verdict.policy_violations[0]}"
            return False
        self.ev.ref.send_fds(fds)
        compared = self.ev.ref.call({"command": "compare", "manifest": msg.get("manifest"), "fds": len(fds),
                                     "label": label}, "compared", self.cfg.reference_timeout_s)
        verdict.phases_s["verify_compare"] = round(verdict.phases_s.get("verify_compare", 0.0) + compared["seconds"],
                                                   3)
        result = compared["result"]
        verdict.max_abs_error = max(verdict.max_abs_error or 0.0, result["max_abs"])
        verdict.max_rel_error = max(verdict.max_rel_error or 0.0, result["rel"])
        errors["candidate"] += result["rel64"]
        errors["eager"] += result["eager_rel64"]
        if not result["ok"]:
            verdict.error = f"incorrect: {result['reason']}"
            return False
        return True
