// Region manifests of published model shapes (Llama, DeepSeek-style MoE) for planning: no weights.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace piper {

// A decoder-only transformer as Llama-3 and DeepSeek-V3 build it: RMSNorm, RoPE, SwiGLU MLPs,
// grouped-query attention (kv_heads < heads) or multi-head latent attention (q_lora/kv_lora > 0),
// and from layer `dense_layers` on a mixture of experts: `experts` routed experts of `expert_ffn`,
// `top_k` per token, plus `shared_experts` of the same size that see every token.
struct ShapeConfig {
  std::string family = "llama";  // llama | deepseek: the manifest's "arch"
  std::string name;
  int64_t layers = 32, d_model = 4096, heads = 32, kv_heads = 8, ffn = 14336, vocab = 128256, seq = 8192;
  int64_t head_dim = 0;  // 0: d_model / heads
  bool tie_embeddings = false;
  // Mixture of experts (0 experts: every layer dense).
  int64_t dense_layers = 0, experts = 0, top_k = 0, shared_experts = 0, expert_ffn = 0;
  // Multi-head latent attention (DeepSeek-V2/V3): low-rank q and kv, a decoupled RoPE part per head.
  int64_t q_lora = 0, kv_lora = 0, qk_rope_dim = 0, qk_nope_dim = 0, v_head_dim = 0;
  // The published parameter count (for the test that the shape is the model), 0 if none.
  int64_t published_params = 0;
};

// Named configurations: llama3-8b, llama3-70b, llama3-405b, deepseek-v3, each with its source.
std::vector<std::string> shape_presets();
std::optional<ShapeConfig> shape_preset(const std::string& name);

// The manifest JSON (docs/manifest.md): parameters with their tensor-parallel layout, FLOPs and
// `work` per region (each product, the causal attention scores, the memory-bound passes), and
// activation memory estimated from the tensors the backward keeps (no model to measure).
// Throws std::invalid_argument for an inconsistent configuration.
std::string shape_manifest_json(const ShapeConfig& c);

}  // namespace piper
