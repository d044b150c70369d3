#!/usr/bin/env bash
# One-command setup of a fresh machine: the pinned CPU test stack (with verl for the `train` extra's tests), this
# package (editable), and Chromium from the system's packages (Debian/Ubuntu), the headless browser the report
# tests open their pages in.
# On a GPU machine whose torch is already installed, torch is left alone (pass --keep-torch to be explicit).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--keep-torch" ] || python3 -c "import torch, sys; sys.exit(0 if torch.version.cuda else 1)" 2>/dev/null; then
  grep -v '^torch==' requirements-ci.txt > /tmp/cuda-agent-reqs.txt
  python3 -m pip install -q -r /tmp/cuda-agent-reqs.txt -r requirements-train.txt
else
  python3 -m pip install -q -r requirements-ci.txt -r requirements-train.txt
fi
python3 -m pip install -q --no-deps verl==0.9.1  # its own pins: requirements-train.txt says why
python3 -m pip install -q --no-deps -e .
if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
  if command -v apt-get >/dev/null; then
    sudo=$([ "$(id -u)" = 0 ] || echo sudo)
    $sudo apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core \
      >/dev/null
  else
    echo "NOTE: no apt-get here: install Chromium yourself for the report tests (tests/test_report.py)" >&2
  fi
fi
python3 -c "import cuda_agent, torch; print('cuda-agent', cuda_agent.__version__, '| torch', torch.__version__)"
