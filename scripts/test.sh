#!/usr/bin/env bash
# Installs what is missing, builds incrementally, and runs every test with ctest, in both
# configurations: Debian's LibTorch 1.13 (build/) and PyPI's PyTorch 2 with CUDA (build-torch2/,
# scripts/setup.sh --torch pypi). Usage: scripts/test.sh [ctest args...]   e.g. scripts/test.sh -L lang
# PIPER_CONFIGS="debian" (or "pypi") runs one configuration only.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
status=0
for config in ${PIPER_CONFIGS:-debian pypi}; do
  case $config in
    debian) build=$root/build ;;
    pypi) build=$root/build-torch2 ;;
    *) echo "test: PIPER_CONFIGS holds debian and/or pypi, not '$config'" >&2; exit 2 ;;
  esac
  echo "== $config LibTorch: $build"
  "$root/scripts/setup.sh" --torch "$config" "$build"
  # One configuration's failures do not hide the other's: both run, the status says if either failed.
  (cd "$build" && ctest --output-on-failure -j"$(nproc)" "$@") || status=1
done
exit $status
