#!/usr/bin/env bash
# Piper's main job on built-in examples: installs what is missing, builds, then runs piper-check
# over every strategy in strategies/ against the example models and prints each report.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh" "$root/build"
exec "$root/scripts/check_strategies.sh" "$root/build/tools/piper-check"
