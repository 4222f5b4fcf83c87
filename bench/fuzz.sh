#!/usr/bin/env bash
# Fuzzes the front end (parse + check + print + re-check) with libFuzzer, ASan and UBSan.
# Usage: bench/fuzz.sh [SECONDS=60] [extra libFuzzer flags]. PIPER_FUZZ_FAST=1: UBSan only (no ASan),
# several times the inputs per second, in build-fuzz-fast/ (for million-input runs). Seeds: tests/errors and strategies/;
# dictionary: bench/fuzz/piper.dict (keywords, integers at the edges, long and deep fragments).
# Reports the number of inputs run; a crash leaves crash-* files and a reproducer command.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-60}; shift || true
"$root/scripts/setup.sh" "$root/build" >/dev/null   # the packages, and the grammar's generator
build=$root/build-fuzz sanitizers=address,undefined
if [ -n "${PIPER_FUZZ_FAST:-}" ]; then build=$root/build-fuzz-fast sanitizers=undefined; fi
if [ ! -f "$build/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DPIPER_FUZZ=ON -DPIPER_FUZZ_SANITIZERS=$sanitizers -DPIPER_BUILD_TESTS=OFF -DPIPER_WITH_TORCH=OFF >/dev/null
fi
cmake --build "$build" --target piper-fuzz >/dev/null
corpus=$build/corpus
mkdir -p "$corpus"
cp -n "$root"/tests/errors/*.piper "$root"/tests/errors/inputs/*.piper "$root"/strategies/*.piper "$corpus"/ 2>/dev/null || true
cd "$build"
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ASAN_OPTIONS=detect_leaks=1
# max_len: strategies are short; timeout: no single input may take seconds (a hang is a bug).
"$build/bench/fuzz/piper-fuzz" "$corpus" -dict="$root/bench/fuzz/piper.dict" -max_total_time="$seconds" -max_len=4096 -timeout=10 \
  -rss_limit_mb=4096 -print_final_stats=1 "$@" 2>&1 | tee "$build/fuzz.log" | grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|==[0-9]+==ERROR|SUMMARY)" || true
if grep -qE "ERROR: libFuzzer|runtime error|ERROR: AddressSanitizer|ERROR: LeakSanitizer" "$build/fuzz.log" ||
   ! grep -q "stat::number_of_executed_units" "$build/fuzz.log"; then
  echo "fuzz: FAILED (see $build/fuzz.log; crash inputs: $build/crash-*)" >&2
  exit 1
fi
echo "fuzz: $(grep -o 'number_of_executed_units: [0-9]*' "$build/fuzz.log" | grep -o '[0-9]*') inputs, no crash"
