#!/usr/bin/env bash
# Installs the build into a fresh prefix and uses it as a user would: the installed piper-check finds
# the strategy library without -I from anywhere, and a small CMake project builds against
# find_package(Piper) and compiles a plan. Usage: install_test.sh BUILD_DIR
set -euo pipefail
build=$1
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
for f in bin/piper-check bin/piper-tune share/piper/strategies/1f1b.piper share/piper/python/piper_export.py share/piper/data/corpus.txt \
         share/doc/piper/README.md lib/cmake/Piper/PiperConfig.cmake include/piper/scheduler/plan.h; do
  [ -e "$tmp/prefix/$f" ] || { echo "FAIL: $f was not installed"; exit 1; }
done
cp "$root/tests/manifests/gpt8.json" "$tmp/m.json"
printf 'use "1f1b.piper";\n' >"$tmp/my.piper"
(cd "$tmp" && "$tmp/prefix/bin/piper-check" m.json my.piper --set pp=2 --set mb=4 >/dev/null) ||
  { echo "FAIL: the installed piper-check does not find the strategy library"; exit 1; }
(cd "$tmp" && "$tmp/prefix/bin/piper-tune" m.json --np 2 --batch-size 8 -o best.piper >/dev/null &&
  "$tmp/prefix/bin/piper-check" m.json best.piper --np 2 --batch-size 8 >/dev/null) ||
  { echo "FAIL: the installed piper-tune does not search the library, or writes a plan piper-check rejects"; exit 1; }
cmake -S "$root/tests/install" -B "$tmp/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/consumer" >/dev/null
out=$("$tmp/consumer/consumer" "$tmp/m.json" "$tmp/my.piper" pp=2 mb=4)
echo "$out"
[[ "$out" == "plan: "*" nodes on 2 ranks" ]] || { echo "FAIL: unexpected consumer output"; exit 1; }
echo "install_test: installed tools, library and find_package(Piper) work"
