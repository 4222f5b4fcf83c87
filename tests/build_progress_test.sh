#!/usr/bin/env bash
# scripts/build_progress.sh: a build prints where it is (a first build takes minutes, and once
# printed nothing for all of them); a build with nothing to do prints nothing; the log keeps it all.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
out=$(printf 'ninja: no work to do.\n' | "$root/scripts/build_progress.sh" "$tmp/log")
[ -z "$out" ] || { echo "FAIL: an up-to-date build printed: $out"; fails=$((fails + 1)); }
out=$(for i in $(seq 1 40); do echo "[$i/40] Building CXX object f$i.o"; done | "$root/scripts/build_progress.sh" "$tmp/log")
lines=$(printf '%s\n' "$out" | grep -c '^setup: ')
grep -q "^setup: building (a first build" <<<"$out" || { echo "FAIL: no start line:"; echo "$out"; fails=$((fails + 1)); }
grep -q "^setup: 50% (20/40) Building CXX object f20.o" <<<"$out" || { echo "FAIL: no halfway line:"; echo "$out"; fails=$((fails + 1)); }
grep -q "^setup: built (40 steps)" <<<"$out" || { echo "FAIL: no end line:"; echo "$out"; fails=$((fails + 1)); }
[ "$lines" = 11 ] || { echo "FAIL: $lines progress lines, want 11 (start, nine tenths, end)"; fails=$((fails + 1)); }
[ "$(wc -l <"$tmp/log")" = 40 ] || { echo "FAIL: the log does not hold all of ninja's output"; fails=$((fails + 1)); }
if ((fails)); then echo "build_progress_test: $fails failed"; exit 1; fi
echo "build_progress_test: all passed"
