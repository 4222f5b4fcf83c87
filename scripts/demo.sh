#!/usr/bin/env bash
# Piper's main job on built-in examples: installs what is missing and builds; checks and simulates
# every strategy in strategies/ against the example models; then builds a tiny GPT (model.pt) with
# piper-model and trains it on the shipped corpus with 4 ranks: 1F1B over 2 pipeline stages × 2
# data-parallel replicas, printing falling losses and writing a trace (build/demo/trace.json).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh" "$root/build"
"$root/scripts/check_strategies.sh" "$root/build/tools/piper-check"
demo=$root/build/demo
mkdir -p "$demo"
echo "== piper-model gpt -> $demo/gpt.pt"
"$root/build/tools/piper-model" gpt --layers 4 --d-model 64 --seq 64 -o "$demo/gpt.pt"
"$root/build/tools/piper-model" verify "$demo/gpt.pt"
echo "== mpirun -np 4 piper-run gpt.pt strategies/1f1b_dp.piper --set pp=2 --set dp=2 --set mb=4"
# As root mpirun needs the two ALLOW variables; 4 ranks on fewer cores need --oversubscribe.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # mpirun as root; piper-run sets its own thread pools
mpirun -np 4 --oversubscribe --bind-to none "$root/build/tools/piper-run" "$demo/gpt.pt" "$root/strategies/1f1b_dp.piper" \
  --set pp=2 --set dp=2 --set mb=4 --batch-size 16 --steps 30 --data "$root/data/corpus.txt" --trace "$demo/trace.json"
echo "trace: $demo/trace.json (open it at https://ui.perfetto.dev, or chrome://tracing)"
