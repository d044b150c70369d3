"""The expert's SFT corpus: tasks composed for the expert's family beyond a train split, each to be answered by the
expert's first (`direct`) reply, so SFT sees the craft on many more operator chains than the episodes the judge
played (a 135M model that imitates 48 tasks' episodes writes their format and none of their semantics on tasks it
never saw: docs/training.md, "Seventh attempt").

The replies are not judged here (that needs the GPU and minutes a task): the expert's fast knobs were verified on
146 of 150 train tasks of the same family on the H200 (docs/data/expert_ceiling_h200_long_set.jsonl), which is what
this corpus rests on. No task shares its operator set with an `exclude`d task (the held-out and validation tasks),
so nothing evaluated is trained on, whatever the order or the sizes. Sizes follow the train tasks': each task's
BATCH gives it the input size of a train task drawn at random (the composer's own are CPU-test sizes). SFT learns
each task's first reply and the next, the call to `verify` (`conversations`).
"""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

from ...agent.environment import opening_messages
from ...agent.tools import wrote
from ...data.catalog import crawl_all
from ...data.compose import compose, draw_source
from ...data.families import LONG_ROW_SHARE, RANDN, family_ops
from ...data.taskfile import with_batch
from .episodes import script
from .formulas import Unsupported
from .trace import trace

BATCH = re.compile(r"^BATCH = (\d+)$", re.MULTILINE)
TURNS = 2  # the expert's replies a corpus conversation holds (`conversations`; in SFT's key; 1 until the eighth try)


def op_set(source: str) -> frozenset[str] | None:
    """The expert's names of a task's operators (None: the expert cannot fuse it)."""
    try:
        return frozenset(trace(source).ops)
    except Unsupported:
        return None


def input_elements(source: str) -> int | None:
    """The input's element count at the task's BATCH (None: not a composer-made `torch.randn(BATCH, ...)` task)."""
    batch, dims = BATCH.search(source), RANDN.search(source)
    if batch is None or dims is None:
        return None
    return int(batch.group(1)) * math.prod(int(d) for d in dims.group(1).split(",") if d.strip()) * int(dims.group(2))


def compose_corpus(count: int, seed: int, exclude: list[str], sizes: list[str], tries: int = 50) -> list[str]:
    """`count` distinct task sources of the expert's family (drawn as `data build --family expert` draws them, from
    `seed`), none with the operator set of an `exclude` source; each resized to the input size of one of `sizes`'s
    sources. ValueError when `tries` x `count` draws do not find them."""
    if count < 1:
        raise ValueError(f"a corpus of {count} tasks")
    excluded = {s for s in map(op_set, exclude) if s is not None}
    elements = [n for n in map(input_elements, sizes) if n]
    ops = family_ops(crawl_all(False)[0], "expert")
    rng = random.Random(seed)
    kept: dict[str, None] = {}  # (ordered, distinct)
    for _ in range(tries * count):
        if len(kept) == count:
            break
        num_ops = int(draw_source(rng, 0.0).split("#")[1])
        composition = compose(ops, rng, num_ops, long_rows=LONG_ROW_SHARE["expert"])
        if composition is None:
            continue
        source = composition.source
        if elements:
            rest = math.prod(composition.input_shape[1:])
            source = with_batch(source, max(1, round(rng.choice(elements) / rest)))
        ops_of = op_set(source)
        if ops_of is not None and ops_of not in excluded:
            kept[source] = None
    if len(kept) < count:
        raise ValueError(f"only {len(kept)} distinct tasks of the expert's family outside the excluded operator sets "
                         f"in {tries * count} draws (asked for {count})")
    return list(kept)


def write_tasks(sources: list[str], folder: Path) -> list[Path]:
    """The corpus as task files in `folder` (corpus_NNNNN.py, in order)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, source in enumerate(sources):
        (folder / f"corpus_{i:05d}.py").write_text(source)
    return tasks_in(folder)


def tasks_in(folder: Path) -> list[Path]:
    """The corpus task files `write_tasks` wrote in `folder`, in order."""
    return sorted(folder.glob("corpus_*.py"))


def conversations(tasks: list[Path], backend: str, compact: bool) -> list[list[dict]]:
    """What SFT learns from each corpus task (one the expert cannot fuse is left out): the opening messages, the
    expert's first (`direct`) reply, what its writes answer (the tool's own words: no judge is asked) and its next
    reply, the call to `verify`. On first replies alone a model learnt to write kernels it never verified, and an
    episode's answer is a verified snapshot (docs/training.md, eighth attempt); what follows `verify` reads the
    judge's words, which only the expert's judged episodes hold."""
    out = []
    for task in tasks:
        source = Path(task).read_text()
        try:
            first, check = script(trace(source), backend, "direct")[:2]
        except Unsupported:
            continue
        calls = [{**call, "id": f"call_{k}"} for k, call in enumerate(first["tool_calls"])]
        results = [{"role": "tool", "tool_call_id": call["id"], "content": wrote(**json.loads(
            call["function"]["arguments"]))} for call in calls]
        out.append([*opening_messages(source, backend, compact), {**first, "tool_calls": calls}, *results, check])
    return out
