#!/usr/bin/env bash
# Installs what Piper needs from Debian's packages (only what is missing), then configures and builds.
# Usage: scripts/setup.sh [BUILD_DIR]   — idempotent and quiet when everything is already there.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}

packages=(
  g++ cmake ninja-build ccache pkg-config python3 universal-ctags
  antlr4 libantlr4-runtime-dev default-jre-headless
  libfmt-dev nlohmann-json3-dev libcli11-dev libtomlplusplus-dev doctest-dev libzip-dev
  libtorch-dev python3-torch libopenblas0-pthread
  libopenmpi-dev openmpi-bin
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
# Quiet when up to date; progress now and then while building (a first build takes minutes); the
# whole log only when something fails.
if ! NINJA_STATUS="[%f/%t] " cmake --build "$build" -- -j"$(nproc)" 2>&1 | "$root/scripts/build_progress.sh" "$build/build.log"; then
  cat "$build/build.log"; echo "setup: build failed (log: $build/build.log)" >&2; exit 1
fi
