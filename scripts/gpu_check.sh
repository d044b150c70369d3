#!/usr/bin/env bash
# GPU checks, run on a machine with an NVIDIA GPU (the device machine): the `gpu` tests, the build-speed and
# evaluation-latency benchmarks, and eval-suite on real KernelBench problems when KERNELBENCH points at them.
# Logs and JSON go to $OUT (default ./gpu-out). Record the results in docs/measurements-log.md, the current numbers
# in docs/measurements.md.
# Usage: scripts/gpu_check.sh [tests] [build] [latency] [fresh] [suite] [throughput] [data] [agreement] [rollout]
#        [expert] [rows] [differential] [public] [streams]
#   (default: tests build latency fresh suite; THROUGHPUT_ARGS adds judge_throughput.py options, e.g. --modes pool,pool2)
# `agreement`: the two GPU clocks on KernelBench tasks (KERNELBENCH, AGREEMENT_TASKS, default 24); `rollout`:
# benchmarks/rollout_speed.py; `expert`: the expert's task set built on the GPU into EXPERT_DATA (default
# $OUT/expert-data; kept when it holds splits/ already), then its ceiling (CEILING_ARGS, default --repeats 1
# --random 1 --limit 150; CEILING_LIMIT seconds, default 300; CEILING_FROM: an earlier slice's jsonl, e.g.
# docs/data/expert_ceiling_h200_long_rows.jsonl, to go on from: only what it lacks is judged, and the table covers
# both). `rows`: the expert's rows kernels by row length beside eager and torch.compile (benchmarks/expert_rows.py).
# `differential`: KernelBench's own eval_kernel_against_ref against --policy kernelbench on the same candidates
# (benchmarks/kernelbench_differential.py; KB_SRC: a KernelBench clone or `git archive` of one revision, e.g.
# .kbsrc/v0.1; the tests' candidates, plus SOLUTIONS judged against KERNELBENCH when both are set).
# `public`: a public solution set (SOLUTIONS, KernelBench's generation layout) judged against KERNELBENCH with
# --policy kernelbench and KB_TIMING (default kernelbench-v0.1) into $OUT/public.json (PUBLIC_DB: a database to
# resume from, e.g. a copy under /tmp kept between calls), then, with KB_SRC, KernelBench's own verdicts beside it.
# `streams`: the trusted clock on each call stream the callee can use (benchmarks/trusted_clock_overhead.py
# --call-streams legacy,torch), and whether a kernel launched without a stream after a torch fill is correct.
# GPU_TESTS_K selects tests by pytest's -k expression (to split the run over calls of a limited length).
# `data` builds DATA_TARGET (default 500) tasks with the default 1-100 ms window into DATA_DIR (default $OUT/data;
# DATA_WORKERS, DATA_TIME_LIMIT seconds, DATA_MAX_ATTEMPTS; rerun with the same DATA_DIR to resume); KERNELBENCH
# should then hold levels 1-3.
set -uo pipefail
stages=" ${*:-tests build latency fresh suite} "
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
export CUDA_AGENT_CACHE=${CUDA_AGENT_CACHE:-/tmp/cuda-agent-cache}
export PYTHONUNBUFFERED=1
status=0
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c \
  "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; nvcc --version | tail -2; } \
  2>&1 | tee "$OUT/env.txt"
if [[ $stages == *" tests "* ]]; then
  python3 -c "import openai" 2>/dev/null || echo "WARNING: no openai package here: the agent episode test will" \
    "fail; install requirements-ci.txt's openai pins (on the device machine: carry their wheels)" | tee -a "$OUT/env.txt"
  python3 -m pytest -m gpu -v -rs -p no:cacheprovider -n 0 tests/test_gpu.py tests/test_gpu_attacks.py \
    ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} 2>&1 \
    | tee "$OUT/gpu_tests.log" || status=1
  # On a GPU machine a skipped GPU test is a test that did not run: fail the check.
  if tail -1 "$OUT/gpu_tests.log" | grep -q "skipped"; then
    echo "FAILED: GPU tests were skipped on a GPU machine (see SKIPPED above)" | tee -a "$OUT/gpu_tests.log"
    status=1
  fi
fi
if [[ $stages == *" build "* ]]; then
  python3 benchmarks/build_speed.py --backend cuda --out "$OUT/build_speed.json" 2>&1 | tee "$OUT/build_speed.log" \
    || status=1
fi
if [[ $stages == *" latency "* ]]; then
  python3 benchmarks/eval_latency.py --backend cuda --out "$OUT/eval_latency.json" \
    ${KERNELBENCH:+--kernelbench "$KERNELBENCH"} 2>&1 | tee "$OUT/eval_latency.log" || status=1
fi
if [[ $stages == *" fresh "* ]]; then
  python3 benchmarks/fresh_inputs.py --backend cuda --out "$OUT/fresh_inputs.json" \
    ${KERNELBENCH:+--kernelbench "$KERNELBENCH"} 2>&1 | tee "$OUT/fresh_inputs.log" || status=1
fi
if [[ $stages == *" throughput "* ]]; then
  python3 benchmarks/judge_throughput.py --backend cuda --out "$OUT/throughput.json" \
    ${KERNELBENCH:+--kernelbench "$KERNELBENCH"} ${THROUGHPUT_ARGS:-} 2>&1 | tee "$OUT/throughput.log" || status=1
fi
if [[ $stages == *" data "* ]]; then
  python3 -m cuda_agent data build --target "${DATA_TARGET:-500}" --out "${DATA_DIR:-$OUT/data}" --backend cuda \
    --workers "${DATA_WORKERS:-12}" ${DATA_TIME_LIMIT:+--time-limit "$DATA_TIME_LIMIT"} \
    ${DATA_MAX_ATTEMPTS:+--max-attempts "$DATA_MAX_ATTEMPTS"} ${KERNELBENCH:+--kernelbench "$KERNELBENCH"} \
    > "$OUT/data.log" 2>&1 || status=1
  tail -30 "$OUT/data.log"
fi
if [[ $stages == *" agreement "* && -n "${KERNELBENCH:-}" ]]; then
  python3 benchmarks/gpu_clock_agreement.py --kernelbench "$KERNELBENCH" --tasks "${AGREEMENT_TASKS:-24}" \
    --out "$OUT/agreement.json" > "$OUT/agreement.log" 2>&1 || status=1
  tail -1 "$OUT/agreement.log"
fi
if [[ $stages == *" differential "* && -n "${KB_SRC:-}" ]]; then
  python3 -c "import pydantic" 2>/dev/null || echo "WARNING: no pydantic here: KernelBench's eval.py imports it and" \
    "every one of its verdicts will fail; install the .whl wheels (requirements-ci.txt's openai pins)" | tee -a "$OUT/env.txt"
  python3 benchmarks/kernelbench_differential.py --kernelbench-src "$KB_SRC" --builtin \
    ${SOLUTIONS:+--suite "$KERNELBENCH" --solutions "$SOLUTIONS"} --out "$OUT/differential.jsonl" \
    > "$OUT/differential.log" 2>&1 || status=1
  grep -A 40 "agree on correctness" "$OUT/differential.log"
fi
if [[ $stages == *" public "* && -n "${KERNELBENCH:-}" && -n "${SOLUTIONS:-}" ]]; then
  # a public solution set: this judge's kernelbench policy (what strict adds, both timings; resumable from
  # PUBLIC_DB), then KernelBench's own evaluation (KB_SRC, KB_JOBS at once) of the same candidates beside it
  db=${PUBLIC_DB:-$OUT/public.db}
  python3 -m cuda_agent eval-suite "$KERNELBENCH" --solutions "$SOLUTIONS" --policy kernelbench \
    --timing "${KB_TIMING:-kernelbench-v0.1}" --workers "${PUBLIC_WORKERS:-12}" --db "$db" --json \
    > "$OUT/public.json" 2> "$OUT/public.log" || status=1
  [[ $db == "$OUT/public.db" ]] || cp "$db" "$OUT/public.db"
  tail -5 "$OUT/public.log"
  if [[ -n "${KB_SRC:-}" ]]; then
    python3 benchmarks/kernelbench_differential.py --kernelbench-src "$KB_SRC" --suite "$KERNELBENCH" \
      --solutions "$SOLUTIONS" --ours "$OUT/public.json" --jobs "${KB_JOBS:-12}" \
      --out "$OUT/public_differential.jsonl" > "$OUT/public_differential.log" 2>&1 || status=1
    grep -A 60 "agree on correctness" "$OUT/public_differential.log"
  fi
fi
if [[ $stages == *" streams "* ]]; then
  python3 benchmarks/trusted_clock_overhead.py --backend cuda --call-streams "${CALL_STREAMS:-legacy,torch}" \
    --rounds "${STREAM_ROUNDS:-3}" --sizes "${STREAM_SIZES:-18,21,24}" --out "$OUT/call_streams.json" 2>&1 \
    | tee "$OUT/call_streams.log" || status=1
fi
if [[ $stages == *" rollout "* ]]; then
  python3 benchmarks/rollout_speed.py --profile --out "$OUT/rollout_speed.json" 2>&1 | tee "$OUT/rollout_speed.log" || status=1
fi
if [[ $stages == *" rows "* ]]; then
  python3 benchmarks/expert_rows.py --out "$OUT/expert_rows.json" > "$OUT/expert_rows.log" 2>&1 || status=1
  cat "$OUT/expert_rows.md" 2>/dev/null || tail -5 "$OUT/expert_rows.log"
fi
if [[ $stages == *" expert "* ]]; then
  expert=${EXPERT_DATA:-$OUT/expert-data}
  if [[ ! -d $expert/splits ]]; then
    python3 -m cuda_agent data build --family expert --target 300 --held-out 0.4 --out "$expert" --backend cuda \
      --no-compile --workers 12 ${KERNELBENCH:+--kernelbench "$KERNELBENCH"} > "$OUT/expert_data.log" 2>&1 || status=1
  fi
  if [[ -n ${CEILING_FROM:-} ]]; then cp "$CEILING_FROM" "$OUT/ceiling.jsonl"; fi
  python3 benchmarks/expert_ceiling.py --data "$expert/splits/train.jsonl" --data "$expert/splits/held_out.jsonl" \
    --backend cuda ${CEILING_ARGS:---repeats 1 --random 1 --limit 150} --time-limit "${CEILING_LIMIT:-300}" \
    --out "$OUT/ceiling.json" > "$OUT/ceiling.log" 2>&1 || status=1
  cat "$OUT/ceiling.md" 2>/dev/null || tail -5 "$OUT/ceiling.log"
fi
if [[ $stages == *" suite "* && -n "${KERNELBENCH:-}" ]]; then
  python3 -m cuda_agent eval-suite "$KERNELBENCH" --solutions benchmarks/solutions --levels 1 --backend cuda \
    --json > "$OUT/suite.json" 2> "$OUT/suite.log" || status=1
  python3 -c "import json; r = json.load(open('$OUT/suite.json')); print('suite overall', r['overall'])" || true
fi
exit $status
