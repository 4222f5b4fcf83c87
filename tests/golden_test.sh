#!/usr/bin/env bash
# Golden tests: piper-check --emit MODE for the cases in tests/golden/MODE/cases.txt must match the
# checked-in files. After an intended change: PIPER_REGENERATE_GOLDEN=1 ctest -R golden (then review
# the diff with git). The svg cases' files are the pictures in docs/img the documentation shows.
# Usage: tests/golden_test.sh PIPER_CHECK MODE
set -uo pipefail
check=$1 mode=$2
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$root/tests/golden/$mode
files=$dir ext=txt
if [ "$mode" = svg ]; then files=$root/docs/img ext=svg; fi
fails=0
while read -r name model strategy args; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  # shellcheck disable=SC2086
  if ! out=$("$check" --verify-each --emit "$mode" $args "$root/tests/manifests/$model.json" "$root/$strategy" 2>&1); then
    echo "FAIL $mode/$name: piper-check failed:"; echo "$out"; fails=$((fails + 1)); continue
  fi
  if [ "${PIPER_REGENERATE_GOLDEN:-0}" = 1 ]; then
    printf '%s\n' "$out" >"$files/$name.$ext"; echo "regenerated $mode/$name"; continue
  fi
  if ! diff -u "$files/$name.$ext" <(printf '%s\n' "$out") >"/tmp/golden-$$.diff"; then
    echo "FAIL $mode/$name differs from ${files#"$root"/}/$name.$ext:"; head -40 "/tmp/golden-$$.diff"
    fails=$((fails + 1))
  fi
  rm -f "/tmp/golden-$$.diff"
done <"$dir/cases.txt"
if ((fails)); then echo "golden $mode: $fails failed"; exit 1; fi
echo "golden $mode: all match"
