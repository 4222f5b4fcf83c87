#!/usr/bin/env bash
# The reference trainer makes the loss fall on the shipped corpus (a tiny GPT, 40 steps).
set -euo pipefail
model=$1 train=$2
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$model" gpt --layers 2 --d-model 64 --seq 64 -o "$tmp/m.pt"
"$train" "$tmp/m.pt" --data "$root/data/corpus.txt" --steps 40 --batch-size 8 --threads 1 --metrics "$tmp/m.jsonl" >/dev/null
${PIPER_PYTHON:-/usr/bin/python3} - "$tmp/m.jsonl" <<'PY'
import json, sys
losses = [r["loss"] for r in map(json.loads, open(sys.argv[1])) if "loss" in r]
first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
print(f"loss {first:.3f} -> {last:.3f} over {len(losses)} steps")
assert len(losses) == 40 and last < first - 1.0, (first, last)
PY
