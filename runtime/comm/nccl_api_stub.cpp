// make_nccl_api where Piper was built without NCCL: a clear error instead of a missing symbol.
#include <stdexcept>

#include "runtime/comm/nccl_api.h"

namespace piper::runtime {

std::unique_ptr<NcclApi> make_nccl_api(int) {
  throw std::runtime_error(
      "this Piper was built without NCCL: configure with the CUDA toolkit and NCCL installed "
      "(CMake's FindCUDAToolkit must find them; -DPIPER_WITH_NCCL=ON makes their absence an error)");
}
bool nccl_built() { return false; }

}  // namespace piper::runtime
