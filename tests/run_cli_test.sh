#!/usr/bin/env bash
# piper-run from the outside: without mpirun, refusing plans it cannot run, and its errors.
# shellcheck source=tests/mpi_test_lib.sh
source "$(dirname "$0")/mpi_test_lib.sh"
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1
"$model_bin" gpt --layers 2 --d-model 32 --ffn 64 --seq 16 -o "$tmp/m.pt"
expect 0 "step    3/3" "runs without mpirun, one rank" -- "$run" "$tmp/m.pt" "$root/strategies/single.piper" --steps 3 --threads 1
expect 1 "the mesh has 2 devices (pp=2) but the world has 1 ranks" "a strategy for 2 ranks on 1" -- \
  "$run" "$tmp/m.pt" "$root/strategies/1f1b.piper" --set pp=2 --steps 1
printf 'use "single.piper";\nprecision bf16;\n' >"$tmp/bf16.piper"
expect 0 "step    1/1" "bf16 mixed precision trains" -- "$run" "$tmp/m.pt" "$tmp/bf16.piper" --steps 1 -I "$root/strategies"
expect 1 "cannot open" "missing data file" -- "$run" "$tmp/m.pt" "$root/strategies/single.piper" --data "$tmp/none.txt"
expect 0 "piper-run" "--version" -- "$run" --version
expect 2 "they are AdamW's" "weight decay with SGD is refused" -- "$run" "$tmp/m.pt" "$root/strategies/single.piper" \
  --optimizer sgd --weight-decay 0.1
expect 0 "lr 0.000333" "the schedule's rate on the step line (warmup: 1e-3 * 1/3)" -- "$run" "$tmp/m.pt" \
  "$root/strategies/single.piper" --steps 1 --threads 1 --warmup-steps 2 --lr-schedule cosine
# --device cuda: Debian's LibTorch has no CUDA (a CUDA one without a GPU: the machine has none).
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  expect 1 "error: device 'cuda:0': this" "--device cuda says why it cannot run" -- \
    "$run" "$tmp/m.pt" "$root/strategies/single.piper" --device cuda
fi
# NCCL needs a GPU: without one (CI) the rank says why and the job stops; with one, it trains.
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  expect 0 "step    1/1" "--comm nccl trains on a GPU machine" -- "$run" "$tmp/m.pt" "$root/strategies/single.piper" --steps 1 --comm nccl
else
  "$run" "$tmp/m.pt" "$root/strategies/single.piper" --steps 1 --comm nccl >"$tmp/out" 2>&1
  if [ $? = 0 ] || ! grep -qE "error: --comm nccl on rank 0: (CUDA|this Piper was built without NCCL)" "$tmp/out"; then
    echo "FAIL: --comm nccl without a GPU:"; cat "$tmp/out"; fails=$((fails + 1))
  fi
fi
expect 2 "STRATEGY is required" "no strategy and no --profile" -- "$run" "$tmp/m.pt"
# --profile writes a machine description with every region measured and a calibration; training
# and the simulator read it.
expect 0 "wrote $tmp/machine.json" "--profile" -- "$run" "$tmp/m.pt" --profile "$tmp/machine.json" --threads 1
${PIPER_PYTHON:-/usr/bin/python3} - "$tmp/machine.json" <<'PY' || fails=$((fails + 1))
import json, sys
m = json.load(open(sys.argv[1]))
assert sorted(m["regions"]) == ["embed", "head", "layers.0", "layers.1"], m["regions"].keys()
for name, r in m["regions"].items():
    for op in ("F", "B", "BI", "BW"):
        assert len(r[op]) == 2 and min(r[op]) >= 0, (name, op, r[op])
    assert r["F"][0] + 4 * r["F"][1] > 0 and r["B"][0] + 4 * r["B"][1] > 0, (name, r)
assert all(m["calibration"][k] > 0 for k in "FBU"), m["calibration"]
assert min(m["update"]) >= 0 and m["profile"]["ranks"] == 1, m
PY
expect 0 "step    2/2" "trains scheduled by a profiled machine" -- "$run" "$tmp/m.pt" "$root/strategies/single.piper" --steps 2 \
  --machine "$tmp/machine.json"
echo '{"flops": 1e9, "memory_bytes": 1, "memory_bandwidth": 1, "link": {"bandwidth": 1}, "update": [-1, 0]}' >"$tmp/bad.json"
expect 1 "\"update\": expected [fixed s, s per parameter byte] (neither negative)" "a bad machine file" -- \
  "$run" "$tmp/m.pt" "$root/strategies/single.piper" --steps 1 --machine "$tmp/bad.json"
# Under mpirun a rank's stdout is a pseudo-terminal whatever mpirun's own output is: a log written
# through it must hold the step lines and no progress bar or terminal escape codes.
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 1 "$run" "$tmp/m.pt" "$root/strategies/single.piper" \
  --steps 3 --threads 1 >"$tmp/mpirun.log" 2>&1
if ! grep -q "step    3/3" "$tmp/mpirun.log" || grep -q $'\033' "$tmp/mpirun.log" || grep -qF '[####' "$tmp/mpirun.log"; then
  echo "FAIL: a log of piper-run under mpirun has escape codes or no steps:"; cat -v "$tmp/mpirun.log"; fails=$((fails + 1))
fi
# Sequence parallelism over tp=2 with a --seq-len it does not divide: a clear error on both ranks.
expect 1 "a sequence of 15 tokens does not divide evenly" "sequence parallelism with an odd --seq-len" -- \
  timeout 60 mpirun -np 2 --oversubscribe "$run" "$tmp/m.pt" "$root/strategies/tp.piper" --set sp=true --seq-len 15 \
  --steps 1 --threads 1 -I "$root/strategies"
# Context parallelism over cp=2 with a --seq-len that 2×cp does not divide: a clear error on both ranks.
expect 1 "a sequence of 14 tokens does not divide evenly into 4 chunks" "context parallelism with a --seq-len 2×cp does not divide" -- \
  timeout 60 mpirun -np 2 --oversubscribe "$run" "$tmp/m.pt" "$root/strategies/cp.piper" --seq-len 14 \
  --steps 1 --threads 1 -I "$root/strategies"
ls "$tmp" | grep -q tmp && { echo "FAIL: --profile left temporary files: $(ls "$tmp")"; fails=$((fails + 1)); }
if ((fails)); then echo "run_cli_test: $fails failed"; exit 1; fi
echo "run_cli_test: all passed"
