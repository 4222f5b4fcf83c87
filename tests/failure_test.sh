#!/usr/bin/env bash
# A failing op ends the whole job — every rank — with a message naming rank, step, op and stream;
# it never hangs. Usage: failure_test.sh PIPER_RUN
set -uo pipefail
run=$1
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1
/usr/bin/python3 "$root/tests/failing_model.py" "$tmp/bad.pt" || exit 1
timeout 120 mpirun -np 2 --oversubscribe --bind-to none "$run" "$tmp/bad.pt" "$root/strategies/1f1b.piper" \
  --set pp=2 --set mb=2 --batch-size 4 --steps 3 --threads 1 >"$tmp/out" 2>&1
rc=$?
if [ "$rc" = 0 ] || [ "$rc" = 124 ]; then echo "FAIL: exit $rc (0: the failure went unnoticed; 124: hung)"; cat "$tmp/out"; exit 1; fi
grep -q "rank 1, step 1, op 1F0 on stream compute: " "$tmp/out" && grep -q "boom: this region fails" "$tmp/out" ||
  { echo "FAIL: message"; cat "$tmp/out"; exit 1; }
echo "failure_test: the job ended (exit $rc) with: $(grep -o 'rank 1, step 1, op 1F0 on stream compute' "$tmp/out" | head -1)"
