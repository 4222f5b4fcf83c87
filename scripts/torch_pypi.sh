# PyTorch from PyPI for Piper's second configuration (sourced by scripts/setup.sh --torch pypi).
# torch_pypi_install: makes the venv $PIPER_TORCH_VENV with that torch (its default Linux wheel: CUDA 13
# with cuDNN and NCCL as nvidia-* wheels) and numpy unless it is there, and sets cmake_args for a build
# against its LibTorch. The venv (about 4.7 GiB) lives outside the checkout, in the user's cache, so
# every clone on the machine (CI's fresh ones too) shares one.
PIPER_TORCH_VERSION=${PIPER_TORCH_VERSION:-2.11.0}  # what the lent GPU machine has
PIPER_TRANSFORMERS_VERSION=${PIPER_TRANSFORMERS_VERSION:-5.25.0}  # the exporter's Hugging Face clients (tests)
PIPER_TORCH_VENV=${PIPER_TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/piper/venv-torch-$PIPER_TORCH_VERSION}

torch_pypi_install() {
  local venv=$PIPER_TORCH_VENV py
  py=$venv/bin/python
  # Debian's python3 (python3-venv from apt), not whatever is first on PATH: the same on every machine.
  [ -x "$py" ] || { mkdir -p "$(dirname "$venv")" && /usr/bin/python3 -m venv "$venv"; }
  if ! "$py" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$PIPER_TORCH_VERSION')" 2>/dev/null; then
    echo "setup: installing torch==$PIPER_TORCH_VERSION from PyPI into $venv (about 4.7 GiB with its CUDA libraries)"
    "$py" -m pip install -q --disable-pip-version-check "torch==$PIPER_TORCH_VERSION" numpy
  fi
  if ! "$py" -c "import transformers, sys; sys.exit(transformers.__version__ != '$PIPER_TRANSFORMERS_VERSION')" 2>/dev/null; then
    "$py" -m pip install -q --disable-pip-version-check "transformers==$PIPER_TRANSFORMERS_VERSION"
  fi
  local torch_dir nccl_dir
  torch_dir=$("$py" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
  nccl_dir=$("$py" -c 'import os, nvidia.nccl as n; print(os.path.dirname(n.__file__) if n.__file__ else list(n.__path__)[0])')
  cmake_args=(
    # The torch folder itself first: TorchConfig's find_library would otherwise take Debian's
    # /usr/lib libtorch.so when both are installed.
    "-DCMAKE_PREFIX_PATH=$torch_dir;$torch_dir/share/cmake"
    # Torch's CUDA config probes the GPU (a try_run CMake 3.25 cannot build with C++20) unless told
    # which architectures to build for: the lent machine's H200 (sm_90).
    "-DTORCH_CUDA_ARCH_LIST=${PIPER_CUDA_ARCH:-9.0}"
    # The NCCL torch loads, not the toolkit's: one libnccl.so.2 in the process.
    "-DNCCL_INCLUDE_DIR=$nccl_dir/include" "-DNCCL_LIBRARY=$nccl_dir/lib/libnccl.so.2"
    -DPIPER_WITH_NCCL=ON
    "-DPIPER_PYTHON=$py"
  )
}
