"""Task families and splits. `all`: every crawled operator; `expert`: only those the expert (rl/expert) fuses, so
every task has a kernel-writing demonstration, half of its chains on long rows (`LONG_ROW_SHARE`). A family's tasks
are split by their operator combination (the set of operators, whatever the order), so no combination is in two
splits: `held_out` takes a share of the combinations, `unseen_op` every task with an operator kept out of training,
and `unseen_shape` re-sizes a few train tasks' rows (an odd last dimension: no vector width divides it)."""

from __future__ import annotations

import hashlib
import random
import re

from .catalog import LAYOUTS, Op
from .compose import render

FAMILIES = ("all", "expert")
LONG_ROW_SHARE = {"all": 0.0, "expert": 0.5}  # chains on long rows (catalog.LONG_ROWS): where a fused kernel that
# holds its row in registers beats torch.compile's looped reductions (docs/training.md, "the expert's ceiling")
SPLITS = ("train", "held_out", "unseen_op", "unseen_shape")


def expert_blocker(source: str) -> str | None:
    """Why the expert cannot fuse this task (None: it can)."""
    from ..rl.expert.formulas import Unsupported  # training's program, read here only to choose the data for it
    from ..rl.expert.trace import trace

    try:
        trace(source)
    except Unsupported as exc:
        return str(exc)
    return None


def family_ops(ops: list[Op], family: str) -> list[Op]:
    """The operators of `family`: for `expert`, those whose single-operator task it fuses at some rank."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r} (choose from {', '.join(FAMILIES)})")
    if family == "all":
        return ops
    kept = []
    for op in ops:
        ranks = tuple(r for r in op.ranks if _single(op, r) is None)
        if ranks:
            kept.append(Op(op.name, op.kind, ranks, op.init, op.call))
    return kept


def _single(op: Op, rank: int) -> str | None:
    shape = LAYOUTS[rank][1]
    init = op.init.format(c=shape[1], c2=shape[1], last=shape[-1]) if op.init else ""
    try:
        return expert_blocker(render([(op, init)], shape))
    except Exception as exc:  # an operator that does not run at this rank
        return f"{type(exc).__name__}: {exc}"


def split_of(ops: list[str], held_out: float, unseen_ops: tuple[str, ...]) -> str:
    """The split of a task made of `ops`: a function of its operator set, so equal combinations never straddle."""
    if any(op in unseen_ops for op in ops):
        return "unseen_op"
    key = "|".join(sorted(set(ops))).encode()
    draw = int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2**64
    return "held_out" if draw < held_out else "train"


RANDN = re.compile(r"torch\.randn\(BATCH((?:, \d+)*), (\d+)\)")


def resized(source: str, rng: random.Random) -> str | None:
    """The task with its rows (last dimension) at another, odd length; None when its source has no such size."""
    match = RANDN.search(source)
    if match is None:
        return None
    last = int(match.group(2))
    new = max(3, last * rng.choice((3, 5)) // 4) | 1
    source = source.replace(match.group(0), f"torch.randn(BATCH{match.group(1)}, {new})")
    return source.replace(f"nn.LayerNorm({last})", f"nn.LayerNorm({new})")
