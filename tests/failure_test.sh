#!/usr/bin/env bash
# A failing op ends the whole job — every rank — with a message naming rank, step, op and stream;
# it never hangs. Usage: failure_test.sh PIPER_RUN
set -uo pipefail
run=$1
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1
${PIPER_PYTHON:-/usr/bin/python3} "$root/tests/failing_model.py" "$tmp/bad.pt" || exit 1
# mb=2 on pp=2, then mb=4 (stage 0 blocks in a receive of a gradient that never comes: the case
# that used to hang), then pp=2 x dp=2 (the failing stage's replica partner blocks in an all-reduce).
for spec in "2 1f1b.piper pp=2 mb=2 4" "2 1f1b.piper pp=2 mb=4 8" "4 1f1b_dp.piper pp=2 dp=2 mb=2 8"; do
  set -- $spec
  np=$1 strategy=$2
  shift 2
  sets=()
  while [ $# -gt 1 ]; do sets+=(--set "$1"); shift; done
  batch=$1
  timeout 120 mpirun -np "$np" --oversubscribe --bind-to none "$run" "$tmp/bad.pt" "$root/strategies/$strategy" \
    "${sets[@]}" --batch-size "$batch" --steps 3 --threads 1 >"$tmp/out" 2>&1
  rc=$?
  if [ "$rc" = 0 ] || [ "$rc" = 124 ]; then echo "FAIL ($spec): exit $rc (0: the failure went unnoticed; 124: hung)"; cat "$tmp/out"; exit 1; fi
  grep -Eq "rank [0-9]+, step 1, op 1F0 on stream compute: " "$tmp/out" && grep -q "boom: this region fails" "$tmp/out" ||
    { echo "FAIL ($spec): message"; cat "$tmp/out"; exit 1; }
  echo "failure_test ($spec): the job ended (exit $rc) with: $(grep -Eo 'rank [0-9]+, step 1, op 1F0 on stream compute' "$tmp/out" | head -1)"
done
