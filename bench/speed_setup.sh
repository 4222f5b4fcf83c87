# Sourced by the speed benches: arguments [BUILD_DIR] [ROUNDS], a scratch folder, and the model they
# share (piper-model gpt 8 layers, d 128, ffn 512, seq 128, in $tmp/m.pt). PIPER_BENCH_KEEP=1 keeps
# the scratch folder (its traces and simulations, for bench/trace_vs_sim.py) and prints where.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
rounds=${2:-3}
tmp=$(mktemp -d)
if [ "${PIPER_BENCH_KEEP:-0}" = 1 ]; then
  trap 'echo "kept: $tmp" >&2' EXIT
else
  trap 'rm -rf "$tmp"' EXIT
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # mpirun as root; nothing about speed
"$build/tools/piper-model" gpt --layers 8 --d-model 128 --ffn 512 --seq 128 -o "$tmp/m.pt" >/dev/null
