"""The trusted path's commands from the judge to the reference worker, and its replies, as typed records.

Each command names its reply. On the channel a record travels as a JSON object: `{"command": NAME, **fields}`,
answered by `{"event": REPLY, **fields}`. `decode` builds a record from such an object, refusing one that lacks a
field the record needs (both ends are trusted; a malformed message is a bug, said as one).
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, ClassVar, TypeVar


@dataclass
class Attach:
    """Take over the candidate's worker: stop it, and from then on resume it only inside calls."""
    worker_pid: int
    others: list[int]  # the sandbox's launchers: stopped and resumed with it
    cgroup: str | None  # the sandbox's cgroup folder (one hierarchy's): its processes, subgroups included
    read_limit: int  # bytes read of one output at most
    own: str | None = None  # (strict, cpu) the folder of the libraries the judge built for it: its CPU time sampled
    COMMAND: ClassVar[str] = "attach"


@dataclass
class Attached:
    scales: bool  # every call's inputs are scaled by a factor drawn for it (the task holds there)
    EVENT: ClassVar[str] = "attached"


@dataclass
class FitSizes:
    """Of these sizes, those at which the task runs."""
    shapes: dict[str, int]
    COMMAND: ClassVar[str] = "fit_sizes"


@dataclass
class Sizes:
    shapes: dict[str, int]
    reason: str  # why the others were left out
    EVENT: ClassVar[str] = "sizes"


@dataclass
class Check:
    """One verification call: inputs drawn from `seed` (at `shapes`, scaled by `scale`), compared with fp64. With
    `reload`, Model's weights are drawn afresh first and the candidate loads them too (kernelbench policy: does
    ModelNew compute with the weights it is given, as strict requires, or with what it made of its own at init?)."""
    seed: int
    shapes: dict[str, int] | None
    scale: float | None
    label: str
    budget_s: float
    reload: bool = False
    COMMAND: ClassVar[str] = "check"


@dataclass
class TimeCandidate:
    """Warm-up and timed calls on fresh inputs; the outputs of timed calls drawn one by one (`wire.timing.
    draw_checks`, `check_bits`) read and compared."""
    timing: dict[str, Any]
    check_bits: int
    budget_s: float
    COMMAND: ClassVar[str] = "time_candidate"


@dataclass
class CandidateChecked:
    """What a check or the timing found. `failed`: how a call failed (`failed`, `ended`, `timeout`); `skipped`:
    why the reference itself does not hold there (nothing checked)."""
    ok: bool = False
    reason: str = ""
    failed: str | None = None
    skipped: str | None = None
    max_abs: float = 0.0
    rel: float = 0.0
    rel64: list[float] = field(default_factory=list)
    eager_rel64: list[float] = field(default_factory=list)
    call_us: float = 0.0
    stats: dict[str, Any] | None = None  # timing only
    findings: list[str] = field(default_factory=list)  # kernelbench policy: what strict would have failed
    EVENT: ClassVar[str] = "candidate_checked"


@dataclass
class Detach:
    """The calls are over. With `end`, the candidate is asked what its in-process audits saw (with a challenge);
    without, it is left stopped (it failed, and is killed)."""
    end: bool = False
    COMMAND: ClassVar[str] = "detach"


@dataclass
class Detached:
    violations: list[str] = field(default_factory=list)
    error: str | None = None
    failed: str | None = None
    EVENT: ClassVar[str] = "detached"


REPLIES: dict[str, type] = {Attach.COMMAND: Attached, FitSizes.COMMAND: Sizes, Check.COMMAND: CandidateChecked,
                            TimeCandidate.COMMAND: CandidateChecked, Detach.COMMAND: Detached}
COMMANDS: dict[str, type] = {c.COMMAND: c for c in (Attach, FitSizes, Check, TimeCandidate, Detach)}

R = TypeVar("R")


class MalformedMessage(ValueError):
    pass


def encode(record: Any) -> dict[str, Any]:
    """A command or a reply as the channel carries it."""
    key = ("command", record.COMMAND) if hasattr(record, "COMMAND") else ("event", record.EVENT)
    return {key[0]: key[1], **asdict(record)}


def decode(cls: type[R], message: dict[str, Any]) -> R:
    """The record `cls` from a channel message (fields it does not know are left out)."""
    values = {}
    for f in fields(cls):
        if f.name in message:
            values[f.name] = message[f.name]
        elif f.default is MISSING and f.default_factory is MISSING:
            raise MalformedMessage(f"{cls.__name__} without {f.name!r}: {str(message)[:200]}")
    return cls(**values)
