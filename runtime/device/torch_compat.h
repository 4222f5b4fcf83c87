// What differs between the LibTorch versions Piper builds against (Debian's 1.13, PyPI's 2.x), in
// one place: the rest of the code is written once, against these names.
#pragma once
#include <c10/core/Allocator.h>
#include <torch/csrc/autograd/function.h>  // Edge and the complete Node its handle needs
#include <torch/version.h>

#include <cstring>

namespace piper::runtime {

// c10::Allocator: 1.13 declares `DataPtr allocate(size_t) const`; 2.x drops the const and adds a
// pure `copy_data` (what clone() of the storage uses). Subclasses implement allocate_bytes.
class CompatAllocator : public c10::Allocator {
 public:
  virtual c10::DataPtr allocate_bytes(size_t n) const = 0;
#if TORCH_VERSION_MAJOR >= 2
  c10::DataPtr allocate(size_t n) override { return allocate_bytes(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
#else
  c10::DataPtr allocate(size_t n) const override { return allocate_bytes(n); }
#endif
};

// An autograd graph node's handle, as an Edge holds it: std::shared_ptr<Node> up to 2.14,
// c10::intrusive_ptr<Node> from 2.15.
using AutogradNodePtr = decltype(torch::autograd::Edge::function);

}  // namespace piper::runtime
