#!/usr/bin/env bash
# A Ray cluster for `cuda-agent train verl` (docs/training.md, "On verl, for clusters"): run on every node.
#   scripts/ray_cluster.sh head                 # on the first node; prints its address
#   scripts/ray_cluster.sh worker HEAD_ADDRESS  # on every other node
#   scripts/ray_cluster.sh stop                 # on every node, when done
# Every GPU of a node joins the cluster. verl's trainer takes `--gpus-per-node` of them per node; with
# `--judge ray` the judge's actors (one per GPU, judge/ray_pool.py) take the rest, so leave some free
# (e.g. 8-GPU nodes: --gpus-per-node 6 keeps 2 per node for judging). RAY_PORT (default 6379) sets the port.
set -euo pipefail
port=${RAY_PORT:-6379}
case "${1:-}" in
  head)
    ray start --head --port="$port" --disable-usage-stats
    echo "head at $(hostname -I | awk '{print $1}'):$port: on the other nodes run $0 worker <that address>";;
  worker)
    [[ -n "${2:-}" ]] || { echo "usage: $0 worker HEAD_ADDRESS[:PORT]" >&2; exit 2; }
    address=$2
    [[ $address == *:* ]] || address="$address:$port"
    ray start --address="$address" --disable-usage-stats;;
  stop)
    ray stop;;
  *)
    echo "usage: $0 head | worker HEAD_ADDRESS | stop" >&2; exit 2;;
esac
