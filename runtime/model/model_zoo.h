// The built-in model zoo: GPT-2-style dense and MoE transformers as TorchScript model.pt files.
#pragma once
#include <cstdint>
#include <string>

namespace piper::runtime {

struct ModelConfig {
  std::string arch = "gpt";  // gpt | moe
  std::string name;          // defaults to "<arch>-<layers>L"
  int64_t layers = 8, d_model = 64, heads = 4, ffn = 256, vocab = 256, seq = 64;
  int64_t experts = 8, top_k = 2;  // moe only
  // moe only: each expert takes at most ceil(capacity_factor * seq * top_k / experts) tokens of a
  // sequence, those that score it highest; its other tokens skip it (GShard's and Switch's token
  // dropping, Megatron's --moe-expert-capacity-factor with the "probs" policy). 0: dropless.
  double capacity_factor = 0;
  bool tie_embeddings = false;     // the head's projection is the token embedding (GPT-2's tie)
  uint64_t seed = 0;
};

// The region manifest of a configuration (docs/manifest.md), computed without allocating weights
// (and so without the measured activation memory).
std::string manifest_json(const ModelConfig& c);

// The same with every region's `memory` measured, on a one-block model of the same shapes.
std::string measured_manifest_json(const ModelConfig& c);

// Builds the TorchScript module with weights initialised from the seed and saves it, with its
// manifest (memory measured) as the extra file piper/manifest.json. Throws std::runtime_error on failure.
void save_model(const ModelConfig& c, const std::string& path);

}  // namespace piper::runtime
