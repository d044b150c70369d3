"""Seed tasks: every crawled operator alone, as a KernelBench file (`cuda-agent data seeds`).

The crawl's result made visible: one task per torch operator (at its first accepted input rank, the CPU-test
base shape) and per transformers operator (as the builder uses it), plus `catalog.json` with what was
found and what could not be instantiated, and why.
"""

from __future__ import annotations

import json
from pathlib import Path

from .catalog import LAYOUTS, crawl_all
from .compose import render


def write_seeds(out: Path, transformers: bool = True) -> dict:
    """Write `out/torch/<op>.py`, `out/transformers/<op>.py` and `out/catalog.json`; returns the catalog."""
    ops, rejected, hf_ops, hf_rejected = crawl_all(transformers)
    for folder in ("torch", "transformers"):
        (out / folder).mkdir(parents=True, exist_ok=True)
    for op in ops:
        shape = LAYOUTS[op.ranks[0]][1]
        channels = shape[1] if len(shape) > 1 else shape[0]
        init = op.init.format(c=channels, c2=channels, last=shape[-1]) if op.init else ""
        (out / "torch" / f"{op.name}.py").write_text(render([(op, init)], shape))
    for op in hf_ops:
        (out / "transformers" / f"{op.name.removeprefix('transformers:').replace(':', '_')}.py").write_text(op.source)
    catalog = {"torch": {"operators": [op.name for op in ops], "not_instantiated": rejected},
               "transformers": None if not transformers else
               {"operators": [op.name for op in hf_ops], "not_instantiated": hf_rejected}}
    (out / "catalog.json").write_text(json.dumps(catalog, indent=2))
    return catalog
