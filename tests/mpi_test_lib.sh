# Sourced by the mpirun test scripts that take PIPER_RUN PIPER_MODEL: their arguments, a scratch
# folder, mpirun as root, a failure counter, `expect`, and a tiny GPT in $tmp/m.pt (4 layers, d 32, seq 16).
set -uo pipefail
run=$1 model_bin=$2
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
expect() {  # expect STATUS TEXT DESCRIPTION -- command...: its exit status and a line of its output
  local want=$1 text=$2 what=$3; shift 4
  "$@" >"$tmp/out" 2>&1
  local got=$?
  if [ "$got" != "$want" ] || ! grep -qF -- "$text" "$tmp/out"; then
    echo "FAIL: $what: exit $got (want $want), looking for '$text' in:"; cat "$tmp/out"; fails=$((fails + 1))
  fi
}
"$model_bin" gpt --layers 4 --d-model 32 --ffn 64 --seq 16 -o "$tmp/m.pt" >/dev/null
# The verdict, last: `finish NAME`.
finish() {
  if ((fails)); then echo "$1: $fails failed"; exit 1; fi
  echo "$1: all passed"
}
