"""SFT settings side by side on the expert's episodes, each scored by the imitation probe (rl/probe.py) on tasks it
never trained on and on tasks it did: which settings teach the expert's craft rather than its conversations, in
about a minute a setting on one GPU and without the judge (the held-out evaluation after SFT, which does need it,
takes ten). The recipe's SFT step with each setting (stages.run_stage, stage rft), from the same model, on the same
episodes, with the same seed.

    python3 benchmarks/sft_sweep.py --model BASE --runs RUN/expert --validation JSONL:SKIP:COUNT
        --trained JSONL:SKIP:COUNT --out DIR [--settings r8:1e-3:60,r0:1e-4:60,...] [--device cuda]
        [--first JSONL:SKIP:COUNT --ceiling CEILING_JSONL] [--corpus N --exclude HELD_OUT_JSONL]

A setting is `rRANK:LR:STEPS[:direct][:first][:corpus][:alone]` (rank 0: every weight trains; `alone`: none of the
episodes in `--runs`, only what the other flags add). `direct`: only the expert's `direct` episodes (with every
shape, the staged shapes' first replies are context: expert/episodes.py's staged_turns). `first`: the expert's first
replies on the `--first` tasks too, every one whose kernel with the fast knobs (the `direct` reply's) the judge
rewarded >= 1 in a ceiling run (`--ceiling`, benchmarks/expert_ceiling.py's jsonl; its task names are the export's
`SET_rowN`, and the ops it traced must be the task's), with that reward. `corpus`: the expert's first replies and
its `verify` calls after them on `--corpus` tasks composed as `train recipe --sft-corpus` composes them
(rl/expert/corpus.py; none with a validation task's operator set, nor an `--exclude` task's: the held-out set a
later `train eval` reads; unjudged). `--runs`: a folder of the expert's run folders (a recipe run's expert/, as
`recipe_h200.sh` brings it back). Writes DIR/SETTING/
(the stage's folder: metrics.jsonl with the probe at step 1 and every checkpoint) and prints one JSON line a setting
(DIR/sweep.jsonl): the probe on the validation tasks at each scored step and on the trained tasks at the end, and at
the end a reply sampled to each validation task at each of `--temperatures` compared with the expert's
(probe.sampled: the share that is one of its first replies).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from _common import task_slice

from cuda_agent.agent.tools import schemas  # noqa: E402
from cuda_agent.rl.expert.corpus import compose_corpus, conversations, write_tasks  # noqa: E402
from cuda_agent.rl.expert.trace import trace  # noqa: E402
from cuda_agent.rl.probe import expert_conversations, imitation, probe_tasks, sampled  # noqa: E402
from cuda_agent.rl.recipe import RecipeConfig  # noqa: E402
from cuda_agent.rl.stages import run_stage  # noqa: E402
from cuda_agent.rl.tokens import TurnTokenizer  # noqa: E402
from cuda_agent.task import task_files  # noqa: E402

SETTINGS = ("r8:1e-3:60,r8:1e-3:60:direct,r8:3e-4:60,r64:1e-3:60,r0:1e-4:60,r8:1e-3:60:direct:first,"
            "r0:1e-4:60:direct:first,r8:1e-3:150:direct:first")


def verified_first_replies(spec: str, ceiling: Path, scratch: Path, backend: str,
                           compact: bool) -> list[tuple[list[dict], float]]:
    """The expert's first reply on each `spec` task a ceiling run verified with the fast knobs, and its reward."""
    path, skip, tasks = task_slice(spec, scratch)
    verdicts = {}
    for line in ceiling.read_text().splitlines():
        row = json.loads(line)
        if row["knobs"] == "fast":
            verdicts[row["task"]] = row
    out = []
    for index, task in enumerate(tasks, start=skip):
        verdict = verdicts.get(f"{path.stem}_row{index}")
        if verdict is None or verdict["reward"] < 1:
            continue
        conversation = expert_conversations([task], backend, compact)
        if conversation and list(trace(task.read_text()).ops) == verdict["ops"]:
            out.append((conversation[0], float(verdict["reward"])))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--runs", type=Path, required=True)
    parser.add_argument("--validation", required=True, help="JSONL:SKIP:COUNT, tasks no setting trains on")
    parser.add_argument("--trained", required=True, help="JSONL:SKIP:COUNT, tasks of the episodes in --runs")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--first", help="JSONL:SKIP:COUNT, tasks whose verified first replies `:first` adds")
    parser.add_argument("--ceiling", type=Path, help="a ceiling run's jsonl (the verdicts `:first` needs)")
    parser.add_argument("--corpus", type=int, default=1000, help="tasks composed for a `:corpus` setting")
    parser.add_argument("--exclude", type=Path, action="append", default=[],
                        help="a JSONL of tasks (the held-out set) whose operator sets the corpus must not have")
    parser.add_argument("--settings", default=SETTINGS)
    parser.add_argument("--backend", default="cuda", help="the backend the expert wrote for")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperatures", default="1.0,0.3",
                        help="each setting's end: a reply sampled to each validation task at each ('' for none)")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    runs = sorted(p.parent for p in args.runs.glob("*/*/trajectory.jsonl"))
    if not runs:
        raise SystemExit(f"{args.runs}: no run folders (*/*/trajectory.jsonl)")
    scratch = Path(tempfile.mkdtemp(prefix="sweep-"))
    recipe = RecipeConfig()
    compact = recipe.stage.compact
    held = probe_tasks(task_slice(args.validation, scratch / "v")[2], args.backend, compact)
    validation = [t.conversation for t in held]
    trained = expert_conversations(task_slice(args.trained, scratch / "t")[2], args.backend, compact)
    turns = TurnTokenizer(AutoTokenizer.from_pretrained(args.model), schemas(compact), tool_format="text")
    first = []
    if any(":first" in s for s in args.settings.split(",")):
        if not (args.first and args.ceiling):
            raise SystemExit("a `:first` setting needs --first and --ceiling")
        first = verified_first_replies(args.first, args.ceiling, scratch / "f", args.backend, compact)
        print(f"{len(first)} verified first replies", flush=True)
    corpus = []
    if any(":corpus" in s for s in args.settings.split(",")):
        excluded = task_slice(args.validation, scratch / "v")[2] + [
            path for i, jsonl in enumerate(args.exclude) for path in task_files(jsonl, scratch / f"x{i}")]
        sources = compose_corpus(args.corpus, args.seed, [p.read_text() for p in excluded],
                                 [p.read_text() for p in task_slice(args.trained, scratch / "t")[2]])
        corpus = [(c, None) for c in conversations(write_tasks(sources, scratch / "corpus"), args.backend, compact)]
        print(f"{len(corpus)} corpus tasks", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    for setting in args.settings.split(","):
        rank, lr, steps, *data = setting.split(":")
        if set(data) - {"direct", "first", "corpus", "alone"}:
            raise SystemExit(f"{setting}: a setting's data flags are `direct`, `first`, `corpus` and `alone`")
        chosen = [] if "alone" in data else [r for r in runs if r.name.startswith("direct-")] if "direct" in data \
            else runs
        config = recipe.stage_config("rft", int(steps), recipe.sft_batch)
        config = replace(config, seed=args.seed, save_every=max(1, int(steps) // 4), train=replace(
            config.train, lora_rank=int(rank.removeprefix("r")), actor_lr=float(lr)))
        out = args.out / setting.replace(":", "_")
        began = time.monotonic()
        run_stage(config, args.model, [], out, None, args.device, chosen, log=lambda m: None, probe=validation,
                  extra=(first if "first" in data else []) + (corpus if "corpus" in data else []))
        seconds = time.monotonic() - began
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        model = AutoModelForCausalLM.from_pretrained(out / "checkpoint" / "actor").to(args.device)
        row = {"setting": setting, "episodes": len(chosen), "first_replies": len(first) if "first" in data else 0,
               "corpus": len(corpus) if "corpus" in data else 0,
               "seconds": round(seconds, 1),
               "validation": [{k: r[k] for k in ("step", "sft_loss", "probe_nll", "probe_greedy_wrong",
                                                 "probe_greedy_exact")} for r in rows if "probe_nll" in r],
               "trained_at_end": imitation(model, turns, trained),
               "sampled": [sampled(model, turns, held, float(t), recipe.stage.max_new_tokens, seed=args.seed,
                                   weights=model.state_dict)
                           for t in args.temperatures.split(",") if t.strip()]}
        del model
        print(json.dumps(row), flush=True)
        with open(args.out / "sweep.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
