#!/usr/bin/env bash
# Installs what Piper needs (only what is missing), then configures and builds. Two configurations:
#   scripts/setup.sh [BUILD_DIR]                 Debian's LibTorch 1.13 (CPU), into build/
#   scripts/setup.sh --torch pypi [BUILD_DIR]    PyTorch from PyPI (PIPER_TORCH_VERSION, default the
#       GPU machine's 2.11.0, with CUDA 13) in a venv (~/.cache/piper/venv-torch-VERSION), into build-torch2/: the
#       device executor and the NCCL communicator linked against its CUDA LibTorch and NCCL.
# Idempotent, and quiet when everything is already there.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
torch=debian
if [ "${1:-}" = --torch ]; then torch=$2; shift 2; fi
case $torch in
  debian) build=${1:-$root/build} ;;
  pypi) build=${1:-$root/build-torch2} ;;
  *) echo "setup: --torch debian|pypi, not '$torch'" >&2; exit 2 ;;
esac

packages=(
  g++ cmake ninja-build ccache pkg-config python3 universal-ctags
  antlr4 libantlr4-runtime-dev default-jre-headless
  libfmt-dev nlohmann-json3-dev libcli11-dev libtomlplusplus-dev doctest-dev libzip-dev
  libtorch-dev python3-torch libopenblas0-pthread
  libopenmpi-dev openmpi-bin
  chromium fonts-liberation
)
[ "$torch" = pypi ] && packages+=(python3-venv)
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

cmake_args=()
if [ "$torch" = pypi ]; then
  # shellcheck source=scripts/torch_pypi.sh
  source "$root/scripts/torch_pypi.sh"
  torch_pypi_install  # sets cmake_args
fi
if [ ! -f "$build/build.ninja" ]; then
  # LibTorch's CMake config warns about things Piper does not use (kineto, CUDA architectures): kept
  # in a log, shown when configuring fails.
  mkdir -p "$build"
  if ! cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${cmake_args[@]}" >"$build/configure.log" 2>&1; then
    cat "$build/configure.log"; echo "setup: configuring failed (log: $build/configure.log)" >&2; exit 1
  fi
fi
# Quiet when up to date; progress now and then while building (a first build takes minutes); the
# whole log only when something fails.
if ! NINJA_STATUS="[%f/%t] " cmake --build "$build" -- -j"$(nproc)" 2>&1 | "$root/scripts/build_progress.sh" "$build/build.log"; then
  cat "$build/build.log"; echo "setup: build failed (log: $build/build.log)" >&2; exit 1
fi
