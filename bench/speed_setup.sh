# Sourced by the speed benches: arguments [BUILD_DIR] [ROUNDS], a scratch folder, and the model they
# share (piper-model gpt 8 layers, d 128, ffn 512, seq 128, in $tmp/m.pt).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
rounds=${2:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # mpirun as root; nothing about speed
"$build/tools/piper-model" gpt --layers 8 --d-model 128 --ffn 512 --seq 128 -o "$tmp/m.pt" >/dev/null
