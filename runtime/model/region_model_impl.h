// RegionModel's insides, shared by the executor (which runs regions itself). LibTorch inside.
#pragma once
#include <torch/script.h>

#include <map>
#include <string>
#include <vector>

#include "runtime/model/region_model.h"

namespace piper::runtime {

struct RegionModel::Impl {
  torch::jit::Module root;
  std::string manifest;
  std::vector<std::string> sequence;
  std::vector<torch::jit::Module> modules;  // per sequence region
  int64_t seq_len = 0, vocab = 0;
  std::map<std::string, std::string> module_of;  // region name -> attribute path
  torch::jit::Module region(const std::string& name) const;  // any region's submodule
};

torch::jit::Module submodule(const torch::jit::Module& root, const std::string& path);

}  // namespace piper::runtime
