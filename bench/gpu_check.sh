#!/usr/bin/env bash
# The prepared check for a machine with NVIDIA GPUs (under 10 minutes): what this version can run
# there, and whether it agrees with the CPU backend. Nothing here has run on a GPU yet (docs/runtime.md).
#  1. builds with -DPIPER_WITH_NCCL=ON (fails if the CUDA toolkit or NCCL is missing) into BUILD_DIR;
#  2. the NCCL communicator's unit tests (the fake) and the real API's start-up (device name, NCCL version);
#  3. collectives through NCCL against MPI: the same training run (dp, ZeRO-3, 1F1B pp=2, DualPipeV
#     pp=2) with --comm nccl and --comm mpi at world 1 and at world N = the GPUs on this machine (one
#     rank per GPU); every step's loss must agree to 1e-5 relative (NCCL sums in another order);
#  4. tokens/s of 1F1B and DualPipeV with --comm nccl and --comm mpi, side by side (tensors on the CPU:
#     the communication path only);
#  5. --device cuda, when the LibTorch found has CUDA (Debian's has not: set TORCH_DIR to a CUDA
#     LibTorch's share/cmake/Torch or its prefix): training on the GPU (world 1, and with two or more
#     GPUs dp, ZeRO-3, 1F1B and DualPipeV) against the same run on the CPU, every step's loss within
#     1e-5 relative; tokens/s on the GPU against the CPU.
# Usage: [TORCH_DIR=...] bench/gpu_check.sh [BUILD_DIR=build-gpu]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-gpu}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "$gpus" -ge 1 ] || { echo "gpu_check: no NVIDIA GPU visible (nvidia-smi -L)" >&2; exit 1; }
echo "== $gpus GPU(s): $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"

echo "== 1. build with NCCL"
"$root/scripts/setup.sh" "$build" >/dev/null
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPIPER_WITH_NCCL=ON \
  ${TORCH_DIR:+-DCMAKE_PREFIX_PATH="$TORCH_DIR"} >/dev/null
cmake --build "$build" >/dev/null

echo "== 2. NCCL unit tests and start-up"
(cd "$build" && ctest -R "NCCL|nccl" --output-on-failure | tail -3)

echo "== 3. NCCL against MPI: every step's loss"
"$build/tools/piper-model" gpt --layers 4 --d-model 64 --ffn 256 --seq 32 -o "$tmp/m.pt" >/dev/null
common=(--data "$root/data/corpus.txt" --steps 5 --batch-size 8 --threads 2)
train() {  # comm np strategy metrics sets... (tensors on ${device:-cpu})
  local comm=$1 np=$2 strategy=$3 out=$4
  shift 4
  local sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  timeout 300 mpirun -np "$np" --oversubscribe --bind-to none "$build/tools/piper-run" "$tmp/m.pt" \
    "$root/strategies/$strategy" "${sets[@]}" "${common[@]}" --comm "$comm" --device "${device:-cpu}" --metrics "$out" >"$out.log" 2>&1 ||
    { echo "gpu_check: $comm $strategy at $np ranks on ${device:-cpu} failed:"; tail -20 "$out.log"; exit 1; }
}
compare() {  # a.jsonl b.jsonl label [what b is]
  /usr/bin/python3 - "$1" "$2" "$3" "${4:-nccl vs mpi}" <<'PY'
import json, sys
def losses(p): return [json.loads(l)["loss"] for l in open(p) if '"loss"' in l]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert a and len(a) == len(b), (a, b)
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"  {sys.argv[3]:<28} {len(a)} steps, losses {a[0]:.5f} -> {a[-1]:.5f}, {sys.argv[4]} {worst:.1e}")
assert worst < 1e-5, sys.argv[4] + ": the losses disagree"
PY
}
cases=("1 dp.piper dp=1" "1 single.piper mb=2")
if [ "$gpus" -ge 2 ]; then
  cases+=("2 dp.piper dp=2" "2 zero3.piper dp=2" "2 1f1b.piper pp=2 mb=4" "2 dualpipev.piper pp=2 mb=4")
fi
for c in "${cases[@]}"; do
  read -r np strategy sets <<<"$c"
  train mpi "$np" "$strategy" "$tmp/mpi.jsonl" $sets
  train nccl "$np" "$strategy" "$tmp/nccl.jsonl" $sets
  compare "$tmp/mpi.jsonl" "$tmp/nccl.jsonl" "$strategy np=$np $sets"
done

echo "== 4. tokens/s (tensors on the CPU: the communication path only)"
if [ "$gpus" -ge 2 ]; then
  for strategy in 1f1b dualpipev; do
    for comm in mpi nccl; do
      train "$comm" 2 "$strategy.piper" "$tmp/speed.jsonl" pp=2 mb=8
      /usr/bin/python3 - "$tmp/speed.jsonl" "$strategy" "$comm" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l]
print(f"  {sys.argv[2]:<10} --comm {sys.argv[3]:<5} {statistics.median(r['tokens_per_s'] for r in rows[1:]):,.0f} tokens/s")
PY
    done
  done
else
  echo "  one GPU: pipelines need two ranks with a GPU each; skipped"
fi

echo "== 5. tensors on the GPU (--device cuda) against the CPU"
speed() {  # metrics label
  /usr/bin/python3 - "$1" "$2" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l]
print(f"  {sys.argv[2]:<36} {statistics.median(r['tokens_per_s'] for r in rows[1:]):,.0f} tokens/s")
PY
}
if ! grep -q "^PIPER_TORCH_CUDA:INTERNAL=ON" "$build/CMakeCache.txt"; then
  echo "  the LibTorch found has no CUDA: --device cuda cannot run (set TORCH_DIR to a CUDA LibTorch); skipped"
else
  for c in "${cases[@]}"; do
    read -r np strategy sets <<<"$c"
    device=cpu train mpi "$np" "$strategy" "$tmp/cpu.jsonl" $sets
    device=cuda train nccl "$np" "$strategy" "$tmp/cuda.jsonl" $sets
    compare "$tmp/cpu.jsonl" "$tmp/cuda.jsonl" "$strategy np=$np $sets" "gpu vs cpu"
  done
  common=(--data "$root/data/corpus.txt" --steps 8 --batch-size 32 --threads 2)
  device=cpu train mpi 1 single.piper "$tmp/s.jsonl" mb=8 && speed "$tmp/s.jsonl" "one rank, cpu"
  device=cuda train nccl 1 single.piper "$tmp/s.jsonl" mb=8 && speed "$tmp/s.jsonl" "one rank, cuda"
  if [ "$gpus" -ge 2 ]; then
    for strategy in 1f1b dualpipev; do
      device=cuda train nccl 2 "$strategy.piper" "$tmp/s.jsonl" pp=2 mb=8 && speed "$tmp/s.jsonl" "$strategy pp=2 mb=8, cuda"
    done
  fi
fi
echo "gpu_check: done"
