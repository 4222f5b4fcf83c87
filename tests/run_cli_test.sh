#!/usr/bin/env bash
# piper-run from the outside: without mpirun, refusing plans it cannot run, and its errors.
set -uo pipefail
run=$1 model_bin=$2
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1
fails=0
expect() {  # expect STATUS TEXT DESCRIPTION -- command...
  local want=$1 text=$2 what=$3; shift 4
  "$@" >"$tmp/out" 2>&1
  local got=$?
  if [ "$got" != "$want" ] || ! grep -qF -- "$text" "$tmp/out"; then
    echo "FAIL: $what: exit $got (want $want), looking for '$text' in:"; cat "$tmp/out"; fails=$((fails + 1))
  fi
}
"$model_bin" gpt --layers 2 --d-model 32 --ffn 64 --seq 16 -o "$tmp/m.pt"
expect 0 "step    3/3" "runs without mpirun, one rank" -- "$run" "$tmp/m.pt" "$root/strategies/single.piper" --steps 3 --threads 1
expect 1 "the mesh has 2 devices (pp=2) but the world has 1 ranks" "a strategy for 2 ranks on 1" -- \
  "$run" "$tmp/m.pt" "$root/strategies/1f1b.piper" --set pp=2 --steps 1
printf 'use "single.piper";\nprecision bf16;\n' >"$tmp/bf16.piper"
expect 0 "step    1/1" "bf16 mixed precision trains" -- "$run" "$tmp/m.pt" "$tmp/bf16.piper" --steps 1 -I "$root/strategies"
expect 1 "cannot open" "missing data file" -- "$run" "$tmp/m.pt" "$root/strategies/single.piper" --data "$tmp/none.txt"
expect 0 "piper-run" "--version" -- "$run" --version
if ((fails)); then echo "run_cli_test: $fails failed"; exit 1; fi
echo "run_cli_test: all passed"
