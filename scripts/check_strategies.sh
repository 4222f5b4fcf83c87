#!/usr/bin/env bash
# Runs piper-check over every strategy in strategies/ against the example model it is written for
# (MoE strategies — files that shard experts — against the MoE manifest) and prints each report
# with its simulated step (unit costs: F=1, B=2, W=1).
# Usage: scripts/check_strategies.sh [PIPER_CHECK]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
check=${1:-$root/build/tools/piper-check}
failed=0
for strategy in "$root"/strategies/*.piper; do
  model=$root/tests/manifests/gpt8.json
  grep -q "experts" "$strategy" && model=$root/tests/manifests/moe8.json
  echo "== $(basename "$strategy") on $(basename "$model")"
  "$check" "$model" "$strategy" --simulate || failed=$((failed + 1))
done
if ((failed)); then echo "check_strategies: $failed strateg$([ $failed = 1 ] && echo y || echo ies) failed" >&2; exit 1; fi
echo "check_strategies: all strategies are valid"
