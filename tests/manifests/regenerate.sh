#!/usr/bin/env bash
# Rewrites the example manifests from the model zoo (piper-model --manifest-only, activation memory
# measured on a one-block probe); the runtime/zoo-manifests test checks they stay in sync. The two
# large ones are too big to probe here: they carry no measured memory (the memory model estimates).
# Usage: tests/manifests/regenerate.sh [PIPER_MODEL]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
model=${1:-$here/../../build/tools/piper-model}
out=${2:-$here}
"$model" gpt --manifest-only -o "$out/gpt8.json"
"$model" moe --manifest-only -o "$out/moe8.json"
"$model" gpt --layers 32 --manifest-only -o "$out/gpt32.json"
# Realistic sizes for `piper-check --simulate --machine machines/h100.json`.
"$model" gpt --name gpt1b --layers 24 --d-model 2048 --heads 16 --ffn 8192 --vocab 50304 --seq 2048 \
  --manifest-only --no-measure -o "$out/gpt1b.json"
"$model" moe --name moe7b --layers 24 --d-model 2048 --heads 16 --ffn 4096 --vocab 50304 --seq 2048 \
  --experts 16 --top-k 2 --manifest-only --no-measure -o "$out/moe7b.json"
"$model" gpt --tie-embeddings --manifest-only -o "$out/gpt8_tied.json"
