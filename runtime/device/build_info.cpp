#include "runtime/device/build_info.h"

#include <fmt/format.h>
#include <torch/version.h>

#include "runtime/comm/nccl_api.h"

namespace piper::runtime {

std::string build_info() {
#if PIPER_TORCH_CUDA  // runtime/CMakeLists.txt: the LibTorch found has CUDA
  const char* cuda = " with CUDA";
#else
  const char* cuda = " (CPU only)";
#endif
  return fmt::format("LibTorch {}{}, {}", TORCH_VERSION, cuda, nccl_built() ? "NCCL communicator" : "no NCCL");
}

}  // namespace piper::runtime
