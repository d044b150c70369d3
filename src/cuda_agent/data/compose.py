"""Compose: fused tasks of 1 to 5 operators chained in one `Model`, in KernelBench format.

The offline composer needs no LLM: it draws a chain whose shapes fit, checking each step on the `meta` device,
and writes the task source with the batch size as a module constant (`BATCH`) so that the runtime can be tuned
and the judge's extra-shape check applies.
"""

from __future__ import annotations

import ast
import math
import random
import re
from dataclasses import dataclass

from ..pyparse import parse as parse_python
from .catalog import LAYOUTS, LONG_ROWS, Op, check

# Shares of the paper's released set, in percent: torch tasks by number of operators, and transformers operators.
SOURCE_SHARES = {"torch#1": 3.40, "torch#2": 83.77, "torch#3": 7.62, "torch#4": 2.80, "torch#5": 1.23,
                 "transformers": 1.18}
HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"


@dataclass
class Composition:
    ops: list[str]
    source: str
    input_shape: tuple[int, ...]  # at BATCH = input_shape[0]


def _width(op: Op, channels: int, rng: random.Random) -> int:
    return min(256, channels * rng.choice((1, 2))) if "{c2}" in op.init else channels


def compose(ops: list[Op], rng: random.Random, num_ops: int, tries: int = 20,
            long_rows: float = 0.0) -> Composition | None:
    """One chain of `num_ops` operators whose shapes fit (None if none was found in `tries` draws). `long_rows`: the
    share of chains, at a rank that has them, on a base shape with long rows (`LONG_ROWS`) instead of `LAYOUTS`'s."""
    for _ in range(tries):
        first = rng.choice(ops)
        rank = rng.choice(first.ranks)
        shape = LAYOUTS[rank][1]
        if long_rows and rank in LONG_ROWS and rng.random() < long_rows:
            shape = rng.choice(LONG_ROWS[rank])
        chain: list[tuple[Op, str]] = []
        current = shape
        for i in range(num_ops):
            choices = [op for op in ops if len(current) in op.ranks and (not chain or op.name != chain[-1][0].name)]
            op = first if i == 0 else rng.choice(choices) if choices else None
            if op is None:
                break
            channels = current[1] if len(current) > 1 else current[0]
            init = op.init.format(c=channels, c2=_width(op, channels, rng), last=current[-1]) if op.init else ""
            try:
                current = check(Op(op.name, op.kind, op.ranks, init=init, call=op.call), current)
            except Exception:  # this op does not fit here: draw another chain
                break
            if math.prod(current) == 0 or min(current) < 1:
                break
            chain.append((op, init))
        if len(chain) == num_ops:
            return Composition([op.name for op, _ in chain], render(chain, shape), shape)
    return None


def render(chain: list[tuple[Op, str]], shape: tuple[int, ...]) -> str:
    inits = [f"        self.op{i} = {init}" for i, (op, init) in enumerate(chain) if op.kind == "module"]
    calls = [f"        x = {op.expression(f'op{i}')}" for i, (op, _) in enumerate(chain)]
    names = " -> ".join(op.name for op, _ in chain)
    dims = ", ".join(["BATCH", *map(str, shape[1:])])
    return (f"{HEADER}\n\nclass Model(nn.Module):\n    \"\"\"{names}\"\"\"\n\n    def __init__(self):\n"
            f"        super().__init__()\n" + ("\n".join(inits) + "\n" if inits else "") +
            "\n    def forward(self, x):\n" + "\n".join(calls) + "\n        return x\n\n\n"
            f"BATCH = {shape[0]}\n\n\ndef get_inputs():\n    return [torch.randn({dims})]\n\n\n"
            "def get_init_inputs():\n    return []\n")


def draw_source(rng: random.Random, transformers_share: float | None = None) -> str:
    """`torch#k` or `transformers` with the paper's shares; `transformers_share` (0-1) overrides the latter's."""
    shares = dict(SOURCE_SHARES)
    if transformers_share is not None:
        torch_total = sum(v for k, v in shares.items() if k != "transformers")
        shares = {k: v / torch_total * (1 - transformers_share) for k, v in shares.items() if k != "transformers"}
        shares["transformers"] = transformers_share
    return rng.choices(list(shares), weights=list(shares.values()))[0]


LLM_PROMPT = """Write a PyTorch task in KernelBench format that applies these operators to its input, in this \
order: {ops}.
Rules: one Python file; `class Model(nn.Module)` whose `forward` takes one tensor `x` and returns one tensor; a \
module-level constant `BATCH` used only by `get_inputs()`; `get_inputs()` returns `[torch.randn(BATCH, ...)]` \
with sizes at which every operator fits; `get_init_inputs()` returns the constructor's arguments (or `[]`). No \
randomness in `forward`, no file or network access. Answer with one ```python code block and nothing else."""
CODE_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


class NoTask(ValueError):
    """The model's reply holds no usable task; the message says why (it goes into the attempt's record)."""


def compose_llm(client, ops: list[Op], rng: random.Random, num_ops: int) -> Composition:
    """Ask a model to chain `num_ops` drawn operators; its code is parsed and checked here, and only ever run in
    the sandbox (`filters.check_task_sandboxed`). NoTask when the reply holds no usable task."""
    chosen = [op.name for op in rng.sample(ops, num_ops)]
    reply = client.complete([{"role": "user", "content": LLM_PROMPT.format(ops=", ".join(chosen))}], None)
    cut = " (the reply was cut off at max_tokens)" if reply.finish_reason == "length" else ""
    match = CODE_BLOCK.search(reply.content or "")
    if not match:
        raise NoTask(("an empty reply" if not (reply.content or "").strip() else "no ```python block in the reply")
                     + cut)
    source = match.group(1)
    try:
        tree = parse_python(source)
    except SyntaxError as exc:
        raise NoTask(f"the code does not parse: {exc.msg} (line {exc.lineno}){cut}") from None
    defined = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    missing = sorted({"Model", "get_inputs", "get_init_inputs", "BATCH"} - defined)
    if missing:
        raise NoTask(f"the code does not define {', '.join(missing)}{cut}")
    return Composition(chosen, source, ())
