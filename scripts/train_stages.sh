#!/usr/bin/env bash
# The four training stages end to end at small scale, each from the previous stage's checkpoint:
#   warmup (single-turn PPO) -> rft (on a scripted expert's solved episodes of the demo task) -> value (critic
#   only) -> agentic (multi-turn PPO with GAE).
# Usage: scripts/train_stages.sh MODEL OUT_DIR
#   MODEL: an HF causal-LM folder. Environment: BACKEND (cuda), TASKS (a task file or folder; default the demo
#   task), STEPS (2), BATCH (4), MAX_TURNS (3), MAX_NEW_TOKENS (256), CACHE_DIR (the judge's cache).
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 MODEL OUT_DIR" >&2; exit 2; }
model=$1 out=$2
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
backend=${BACKEND:-cuda}
tasks=${TASKS:-src/cuda_agent/rl/demo_task/affine_relu.py}
cache=(${CACHE_DIR:+--cache-dir "$CACHE_DIR"})
common=(--backend "$backend" --data "$tasks" --steps "${STEPS:-2}" --batch "${BATCH:-4}" --max-turns
        "${MAX_TURNS:-3}" --max-new-tokens "${MAX_NEW_TOKENS:-256}" --max-context 6144 "${cache[@]}")
mkdir -p "$out"
stage() { local began=$SECONDS; echo "== $1 ($(date -u +%T))"; "${@:2}"; echo "   $1: $((SECONDS - began)) s"; }

stage warmup python3 -m cuda_agent train --stage warmup --model "$model" --out "$out/warmup" "${common[@]}"
stage expert python3 -c "import sys; from pathlib import Path
from cuda_agent.judge.config import JudgeConfig
from cuda_agent.judge.pool import JudgePool
from cuda_agent.rl.demo import expert_runs
config = JudgeConfig(cache_dir=Path(sys.argv[3])) if sys.argv[3] else JudgeConfig()
with JudgePool(sys.argv[1], config) as pool:
    for s in expert_runs(pool, Path(sys.argv[2])):
        print('   expert run: reward', s['final_verdict']['reward'] if s.get('final_verdict') else None)
" "$backend" "$out/expert" "${CACHE_DIR:-}"
stage rft python3 -m cuda_agent train --stage rft --model "$out/warmup/checkpoint/actor" --runs "$out/expert" \
  --out "$out/rft" --backend "$backend" --steps "${STEPS:-2}" --batch 2
stage value python3 -m cuda_agent train --stage value --model "$out/rft/checkpoint/actor" --out "$out/value" \
  "${common[@]}"
stage agentic python3 -m cuda_agent train --stage agentic --model "$out/value/checkpoint/actor" \
  --out "$out/agentic" "${common[@]}"
for s in warmup rft value agentic; do echo "$s: $(tail -1 "$out/$s/metrics.jsonl")"; done
