#!/usr/bin/env bash
# V-Half's schedule files (strategies/vhalf/) are the output of strategies/vhalf/gen_vhalf.py, which
# rebuilds the published construction: regenerated here, they must be the shipped files, and each one
# must run back out of `vhalf.piper` (`order from "vhalf/pp{pp}_mb{mb}.csv"`) as --emit torch-csv.
# A file whose order is edited by hand fails the first comparison (checked on a copy).
#   vhalf_files_test.sh PIPER_CHECK PYTHON
set -uo pipefail
check=$1 python=$2
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
specs=()
for f in "$root"/strategies/vhalf/pp*_mb*.csv; do
  base=$(basename "$f" .csv)
  pp=${base#pp}; pp=${pp%%_*}; mb=${base#*_mb}
  specs+=("$pp:$mb")
done
# Every configuration vhalf.piper's assert and domains admit has its file (piper-tune may pick any).
for pp in 2 4 8 16; do
  for mb in 4 8 16 32; do
    if [ "$mb" -ge $((2 * pp)) ] && [ "$mb" -le $((8 * pp)) ] && [ ! -f "$root/strategies/vhalf/pp${pp}_mb${mb}.csv" ]; then
      fail "vhalf.piper admits pp=$pp mb=$mb but strategies/vhalf/ has no file for it"
    fi
  done
done
"$python" "$root/strategies/vhalf/gen_vhalf.py" "$tmp" "${specs[@]}" || fail "gen_vhalf.py failed"
for spec in "${specs[@]}"; do
  pp=${spec%%:*} mb=${spec##*:} name=pp${spec%%:*}_mb${spec##*:}.csv
  diff -q "$root/strategies/vhalf/$name" "$tmp/$name" >/dev/null || fail "$name is not gen_vhalf.py's output"
  "$check" "$root/tests/manifests/gpt32.json" "$root/strategies/vhalf.piper" --set pp="$pp" --set mb="$mb" \
    --emit torch-csv -o "$tmp/$name.back" 2>"$tmp/err" || { fail "vhalf.piper pp=$pp mb=$mb does not check"; cat "$tmp/err"; continue; }
  diff -q "$root/strategies/vhalf/$name" "$tmp/$name.back" >/dev/null || fail "$name read back emits another schedule"
done
# The comparison can fail: two actions swapped on rank 0's line.
sed '1s/^\([^,]*\),\([^,]*\),/\2,\1,/' "$root/strategies/vhalf/pp2_mb8.csv" >"$tmp/edited.csv"
diff -q "$tmp/edited.csv" "$tmp/pp2_mb8.csv" >/dev/null && fail "an edited file compares equal"
# A configuration the library has no file for: refused by the file's assert; a path whose file is
# missing: the error names the path after substitution.
"$check" "$root/tests/manifests/gpt32.json" "$root/strategies/vhalf.piper" --set pp=2 --set mb=32 2>"$tmp/err" &&
  fail "pp=2 mb=32 (no file) checks"
grep -q "V-Half's schedule files are for" "$tmp/err" || { fail "pp=2 mb=32: not the assert's message"; cat "$tmp/err"; }
printf 'param pp = 2;\nmesh pp = pp;\nsplit batch into 4;\norder from "none/pp{pp}_x.csv";\n' >"$tmp/missing.piper"
"$check" "$root/tests/manifests/gpt32.json" "$tmp/missing.piper" 2>"$tmp/err" && fail "a missing schedule file checks"
grep -q 'missing.piper:4:12: error: cannot find schedule "none/pp2_x.csv"' "$tmp/err" ||
  { fail "no located error naming none/pp2_x.csv"; cat "$tmp/err"; }
[ "$fails" = 0 ] && echo "vhalf files: ${#specs[@]} regenerated and read back"
exit $((fails > 0))
