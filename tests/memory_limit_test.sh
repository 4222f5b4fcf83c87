#!/usr/bin/env bash
# --memory-limit: the memory model's predicted peak, with 10% to spare, trains; 10% under it ends
# the whole job — every rank, also those blocked waiting for the failing one — with the rank, step,
# op, stream and an out-of-memory message; it never hangs. 1F1B pp=2 with 4 microbatches, so the
# other rank is blocked in a receive when the fullest one fails.
# Usage: memory_limit_test.sh PIPER_CHECK PIPER_RUN PIPER_MODEL
set -uo pipefail
check=$1 run=$2 model=$3
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$model" gpt --layers 4 --d-model 64 --ffn 256 --seq 32 -o "$tmp/m.pt" || exit 1
args=(--set pp=2 --set mb=4 --batch-size 16)
"$check" "$tmp/m.pt" "$root/strategies/1f1b.piper" --np 2 "${args[@]}" --emit sim-json -o "$tmp/sim.json" || exit 1
peak=$(${PIPER_PYTHON:-/usr/bin/python3} -c "import json; print(max(r['peak_bytes'] for r in json.load(open('$tmp/sim.json'))['ranks']))")
ok=$((peak * 11 / 10)) tight=$((peak * 9 / 10))
attempt() {  # attempt LIMIT LOG
  timeout 120 mpirun -np 2 --oversubscribe --bind-to none "$run" "$tmp/m.pt" "$root/strategies/1f1b.piper" "${args[@]}" \
    --steps 2 --threads 1 --memory-limit "$1" >"$2" 2>&1
}
attempt "$ok" "$tmp/ok.log" || { echo "FAIL: the predicted peak ($peak bytes) + 10% should train"; cat "$tmp/ok.log"; exit 1; }
attempt "$tight" "$tmp/tight.log"
rc=$?
if [ "$rc" = 0 ] || [ "$rc" = 124 ]; then echo "FAIL: exit $rc under $tight bytes (0: no error; 124: hung)"; cat "$tmp/tight.log"; exit 1; fi
grep -qE "rank [01], step 1, op [0-9A-Z_.]+ on stream [a-z_0-9]+: out of memory: needs .* more \(.* live\), limit" "$tmp/tight.log" ||
  { echo "FAIL: no out-of-memory message naming rank, step, op and stream"; cat "$tmp/tight.log"; exit 1; }
echo "memory_limit_test: predicted peak $peak B; +10% trains; -10% ends the job: $(grep -oE 'rank [01], step 1, op .*' "$tmp/tight.log" | head -1)"
