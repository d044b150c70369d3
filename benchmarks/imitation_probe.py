"""The imitation probe (rl/probe.py) of models on task slices, side by side: how closely each model writes the
expert's first reply, teacher-forced, on tasks it trained on and on tasks it never saw. A supervised stage that
learnt the expert's craft scores alike on both; one that memorised its conversations scores far better on the
first. Runs on the CPU (a SmolLM2-135M reply of 3,500 tokens: about 3 s) or a GPU.

    python3 benchmarks/imitation_probe.py --model BASE [--adapter ADAPTER_DIR ...] --slice NAME=JSONL:SKIP:COUNT ...
        [--backend cuda] [--device cpu] [--out FILE]

`--adapter`: a LoRA adapter folder (a stage's checkpoint/actor/adapter), rebuilt on BASE; BASE itself is probed too.
`--slice`: rows SKIP .. SKIP+COUNT of a task export (e.g. train=splits/train.jsonl:0:16 for tasks the recipe
trained on with TRAIN_TASKS=48, validation=splits/train.jsonl:48:32 for train-split tasks it never saw).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from _common import task_slice

from cuda_agent.agent.tools import schemas  # noqa: E402
from cuda_agent.rl.lora import merged_model  # noqa: E402
from cuda_agent.rl.probe import expert_conversations, imitation  # noqa: E402
from cuda_agent.rl.tokens import TurnTokenizer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--adapter", type=Path, action="append", default=[])
    parser.add_argument("--slice", action="append", required=True, help="NAME=JSONL:SKIP:COUNT")
    parser.add_argument("--backend", default="cuda", help="the backend the expert writes for")
    parser.add_argument("--compact", action=argparse.BooleanOptionalAction, default=True,
                        help="the compact prompt and tool set (the recipe's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    turns = TurnTokenizer(tokenizer, schemas(args.compact), tool_format="text")
    slices, scratch = {}, Path(tempfile.mkdtemp(prefix="probe-"))
    for spec in args.slice:
        name, _, rest = spec.partition("=")
        slices[name] = expert_conversations(task_slice(rest, scratch / name)[2], args.backend, args.compact)
    rows = []
    for label in [None, *args.adapter]:
        model = AutoModelForCausalLM.from_pretrained(args.model) if label is None else \
            merged_model(label, root=args.model)
        model.to(args.device)
        for name, conversations in slices.items():
            began = time.monotonic()
            row = {"model": str(label or args.model), "slice": name, **imitation(model, turns, conversations),
                   "seconds": round(time.monotonic() - began, 1), "device": args.device}
            print(json.dumps(row), flush=True)
            rows.append(row)
        del model
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
