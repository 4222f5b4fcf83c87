// What this binary was built against (LibTorch's version, CUDA, NCCL), for --version and logs.
#pragma once
#include <string>

namespace piper::runtime {

// For example "LibTorch 2.11.0 with CUDA, NCCL communicator" or "LibTorch 1.13.1 (CPU only)".
std::string build_info();

}  // namespace piper::runtime
