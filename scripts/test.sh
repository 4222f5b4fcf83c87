#!/usr/bin/env bash
# Installs what is missing (apt), builds incrementally, and runs every test with ctest.
# Usage: scripts/test.sh [ctest args...]   e.g. scripts/test.sh -L lang
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh" "$root/build"
cd "$root/build"
ctest --output-on-failure -j"$(nproc)" "$@"
