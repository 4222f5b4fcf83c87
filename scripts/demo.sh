#!/usr/bin/env bash
# Piper's main job on built-in examples: installs what is missing and builds; checks and simulates
# every strategy in strategies/ against the example models; then builds a tiny GPT (model.pt) with
# piper-model, checks a pipeline strategy against it and trains it on the shipped corpus with the
# single-device reference loop, printing falling losses.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh" "$root/build"
"$root/scripts/check_strategies.sh" "$root/build/tools/piper-check"
demo=$root/build/demo
mkdir -p "$demo"
echo "== piper-model gpt -> $demo/gpt.pt"
"$root/build/tools/piper-model" gpt --layers 4 --d-model 64 --seq 64 -o "$demo/gpt.pt"
"$root/build/tools/piper-model" verify "$demo/gpt.pt"
"$root/build/tools/piper-check" "$demo/gpt.pt" "$root/strategies/1f1b.piper" --set pp=2 --set mb=4 --emit torch-csv
echo "== piper-train-ref: 30 steps on data/corpus.txt"
OMP_WAIT_POLICY=PASSIVE "$root/build/tools/piper-train-ref" "$demo/gpt.pt" --data "$root/data/corpus.txt" --steps 30 --batch-size 8
