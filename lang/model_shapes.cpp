#include "lang/model_shapes.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <stdexcept>

namespace piper {

using nlohmann::json;

namespace {

// Sources: Llama 3 — "The Llama 3 Herd of Models" (Dubey et al. 2024), Table 3, and Meta's released
// params.json (vocabulary 128,000 + 256 reserved tokens); DeepSeek-V3 — its technical report
// (arXiv 2412.19437) §4.2 and the released config.json (dense FFN 18,432, vocabulary 129,280).
// Sequence lengths are the pre-training ones (8,192 and 4,096).
std::vector<ShapeConfig> presets() {
  std::vector<ShapeConfig> out;
  auto llama = [&](const char* name, int64_t L, int64_t d, int64_t h, int64_t f, int64_t published) {
    ShapeConfig c;
    c.name = name;
    c.layers = L, c.d_model = d, c.heads = h, c.kv_heads = 8, c.ffn = f, c.vocab = 128256, c.seq = 8192;
    c.published_params = published;
    out.push_back(c);
  };
  llama("llama3-8b", 32, 4096, 32, 14336, 8'030'000'000);
  llama("llama3-70b", 80, 8192, 64, 28672, 70'600'000'000);
  llama("llama3-405b", 126, 16384, 128, 53248, 405'000'000'000);
  ShapeConfig v3;
  v3.family = "deepseek", v3.name = "deepseek-v3";
  v3.layers = 61, v3.d_model = 7168, v3.heads = 128, v3.kv_heads = 128, v3.ffn = 18432, v3.vocab = 129280, v3.seq = 4096;
  v3.dense_layers = 3, v3.experts = 256, v3.top_k = 8, v3.shared_experts = 1, v3.expert_ffn = 2048;
  v3.q_lora = 1536, v3.kv_lora = 512, v3.qk_rope_dim = 64, v3.qk_nope_dim = 128, v3.v_head_dim = 128;
  v3.published_params = 671'000'000'000;
  out.push_back(v3);
  return out;
}

json param(const std::string& name, std::vector<int64_t> shape, int shard_dim = -1) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  json p{{"name", name}, {"shape", shape}, {"dtype", "float32"}, {"bytes", n * 4}};
  if (shard_dim >= 0) p["shard"] = {{"dim", shard_dim}, {"blocks", 1}};
  return p;
}
json act(std::vector<int64_t> shape, const char* dtype = "float32") { return json{{"shape", shape}, {"dtype", dtype}}; }
json gemm(int64_t m, int64_t n, int64_t k, const char* shard = "") {
  json w{{"op", "gemm"}, {"m", m}, {"n", n}, {"k", k}};
  if (*shard) w["shard"] = shard;
  return w;
}
json memory(int64_t elements, bool sharded = false) {
  json w{{"op", "memory"}, {"elements", elements}};
  if (sharded) w["shard"] = "n";
  return w;
}
double work_flops(const json& work) {
  double f = 0;
  for (const json& w : work) {
    if (w["op"] == "gemm") f += 2.0 * w["m"].get<double>() * w["n"].get<double>() * w["k"].get<double>();
    if (w["op"] == "attention")
      f += 2.0 * w["q"].get<double>() * w["kv"].get<double>() * w["heads"].get<double>() *
           (w["head_dim"].get<double>() + w["v_dim"].get<double>()) / (w["causal"].get<bool>() ? 2 : 1);
  }
  return f;
}

// Activation memory per sample, estimated (fp32 elements × 4; the memory model halves it in bf16):
// `saved` what the backward keeps (Korthikanti et al. 2022's accounting, flash attention keeping its
// output and log-sum-exp instead of the scores), replicated over tp or sharded; the peaks add the
// largest transient. memory_tp2 is one rank's part of a slice of two.
void estimate_memory(json& region, int64_t replicated, int64_t sharded, int64_t transient) {
  auto row = [](int64_t elems) { return json::array({elems * 4, elems * 8, elems * 16}); };
  auto mem = [&](int64_t rep, int64_t sh, int64_t tr) {
    return json{{"saved", row(rep + sh)}, {"forward_peak", row(rep + sh + tr)}, {"backward_peak", row(rep + sh + tr)}};
  };
  region["memory"] = mem(replicated, sharded, transient);
  if (region.contains("tp")) region["memory_tp2"] = mem(replicated, sharded / 2, transient / 2);
}

json region(const std::string& name, const char* kind, json params, json work, int64_t s, int64_t d) {
  json r{{"name", name}, {"kind", kind}, {"module", name}, {"params", std::move(params)},
         {"input", act({s, d})}, {"output", act({s, d})}};
  r["flops"] = static_cast<int64_t>(work_flops(work));
  r["work"] = std::move(work);
  return r;
}

// Grouped-query attention (Llama): RMSNorm, q/k/v, RoPE, causal flash attention, output projection.
json gqa_attention(const ShapeConfig& c, const std::string& p) {
  const int64_t s = c.seq, d = c.d_model, hd = c.head_dim, q = c.heads * hd, kv = c.kv_heads * hd;
  json params = {param("attention_norm", {d}), param("wq", {q, d}, 0), param("wk", {kv, d}, 0), param("wv", {kv, d}, 0),
                 param("wo", {d, q}, 1)};
  json work = {memory(2 * s * d), gemm(s, q + 2 * kv, d, "n"), memory(2 * s * (q + kv), true),
               {{"op", "attention"}, {"heads", c.heads}, {"head_dim", hd}, {"v_dim", hd}, {"q", s}, {"kv", s}, {"causal", true}},
               gemm(s, d, q, "k"), memory(3 * s * d)};
  json r = region(p + ".attn", "attention", params, work, s, d);
  r["tp"] = {{"dim", "heads"}, {"count", c.kv_heads}};  // key/value heads bind first
  r["cp"] = "attention";
  // Kept: norm input and output, output; per rank: q, k, v, the attention output and log-sum-exp.
  estimate_memory(r, 3 * s * d, s * (2 * q + 2 * kv + c.heads), s * (q + 2 * kv));
  return r;
}

// Multi-head latent attention (DeepSeek-V2/V3): q and kv through low-rank bottlenecks (normed),
// each head's key a no-RoPE part from the kv bottleneck and a RoPE part shared by all heads.
json mla_attention(const ShapeConfig& c, const std::string& p) {
  const int64_t s = c.seq, d = c.d_model, h = c.heads, qk = c.qk_nope_dim + c.qk_rope_dim;
  json params = {param("attention_norm", {d}),
                 param("wq_a", {c.q_lora, d}),
                 param("q_norm", {c.q_lora}),
                 param("wq_b", {h * qk, c.q_lora}, 0),
                 param("wkv_a", {c.kv_lora + c.qk_rope_dim, d}),
                 param("kv_norm", {c.kv_lora}),
                 param("wkv_b", {h * (c.qk_nope_dim + c.v_head_dim), c.kv_lora}, 0),
                 param("wo", {d, h * c.v_head_dim}, 1)};
  json work = {memory(2 * s * d),
               gemm(s, c.q_lora + c.kv_lora + c.qk_rope_dim, d),
               memory(2 * s * (c.q_lora + c.kv_lora)),
               gemm(s, h * qk, c.q_lora, "n"),
               gemm(s, h * (c.qk_nope_dim + c.v_head_dim), c.kv_lora, "n"),
               {{"op", "attention"}, {"heads", h}, {"head_dim", qk}, {"v_dim", c.v_head_dim}, {"q", s}, {"kv", s}, {"causal", true}},
               gemm(s, d, h * c.v_head_dim, "k"),
               memory(3 * s * d)};
  json r = region(p + ".attn", "attention", params, work, s, d);
  r["tp"] = {{"dim", "heads"}, {"count", h}};
  r["cp"] = "attention";
  const int64_t rep = 3 * s * d + 2 * s * (c.q_lora + c.kv_lora + c.qk_rope_dim);
  estimate_memory(r, rep, s * h * (2 * qk + 2 * c.v_head_dim + 1), s * h * (qk + c.v_head_dim));
  return r;
}

// A SwiGLU MLP of inner size f: w2(silu(w1 x) * w3 x); `norm` when it starts from the residual;
// `tp` when tensor parallelism can split its hidden units (a routed expert is whole on its rank).
json swiglu(const std::string& name, const char* kind, int64_t tokens, int64_t d, int64_t f, int64_t s, bool norm, bool tp = true) {
  json params = json::array();
  if (norm) params.push_back(param("ffn_norm", {d}));
  const int col = tp ? 0 : -1, row = tp ? 1 : -1;
  for (json p : {param("w1", {f, d}, col), param("w3", {f, d}, col), param("w2", {d, f}, row)}) params.push_back(p);
  json work = json::array();
  if (norm) work.push_back(memory(2 * tokens * d));
  for (json w : {gemm(tokens, 2 * f, d, "n"), memory(3 * tokens * f, true), gemm(tokens, d, f, "k"), memory(3 * tokens * d)})
    work.push_back(w);
  json r = region(name, kind, params, work, s, d);
  if (tp) r["tp"] = {{"dim", "hidden"}, {"count", f}};
  if (std::string_view(kind) == "mlp") r["cp"] = "tokenwise";
  estimate_memory(r, (norm ? 3 : 2) * tokens * d, 4 * tokens * f, 2 * tokens * f);
  return r;
}

// A mixture-of-experts layer's regions: the router (RMSNorm and the gate's scores), the shared
// experts as one SwiGLU of their summed width, and the routed experts, each seeing on average
// top_k / experts of the tokens (the work and memory of a balanced routing).
void moe_layer(const ShapeConfig& c, const std::string& p, json& regions) {
  const int64_t s = c.seq, d = c.d_model, E = c.experts;
  json router = region(p + ".moe.router", "router", {param("ffn_norm", {d}), param("gate", {E, d}), param("gate_bias", {E})},
                       {memory(2 * s * d), gemm(s, E, d), memory(3 * s * E)}, s, d);
  router["output"] = act({s, E});
  estimate_memory(router, 2 * s * d + 2 * s * E, 0, s * E);
  regions.push_back(router);
  if (c.shared_experts > 0)
    regions.push_back(swiglu(p + ".moe.shared", "shared_expert", s, d, c.shared_experts * c.expert_ffn, s, false));
  const int64_t tokens = (s * c.top_k + E - 1) / E;
  for (int64_t j = 0; j < E; ++j)
    regions.push_back(swiglu(fmt::format("{}.moe.experts.{}", p, j), "expert", tokens, d, c.expert_ffn, s, false, false));
}

void check(const ShapeConfig& c) {
  auto bad = [](const std::string& why) { throw std::invalid_argument(why); };
  if (c.family != "llama" && c.family != "deepseek") bad("unknown family '" + c.family + "' (llama or deepseek)");
  if (c.layers < 1 || c.d_model < 1 || c.heads < 1 || c.kv_heads < 1 || c.ffn < 1 || c.vocab < 1 || c.seq < 1)
    bad("sizes must be positive");
  if (c.head_dim == 0 && c.d_model % c.heads != 0)
    bad(fmt::format("--d-model {} is not divisible by --heads {} (or give --head-dim)", c.d_model, c.heads));
  if (c.heads % c.kv_heads != 0) bad(fmt::format("--heads {} is not a multiple of --kv-heads {}", c.heads, c.kv_heads));
  if (c.experts > 0 && (c.top_k < 1 || c.top_k > c.experts || c.expert_ffn < 1))
    bad(fmt::format("a mixture of experts needs --top-k in 1..{} and a positive --expert-ffn", c.experts));
  if (c.experts == 0 && c.dense_layers > 0) bad("--dense-layers without --experts");
  const bool mla = c.q_lora > 0 || c.kv_lora > 0;
  if (mla && (c.q_lora < 1 || c.kv_lora < 1 || c.qk_rope_dim < 1 || c.qk_nope_dim < 1 || c.v_head_dim < 1))
    bad("latent attention needs --q-lora, --kv-lora, --qk-rope-dim, --qk-nope-dim and --v-head-dim, all positive");
}

}  // namespace

std::vector<std::string> shape_presets() {
  std::vector<std::string> out;
  for (const ShapeConfig& c : presets()) out.push_back(c.name);
  return out;
}

std::optional<ShapeConfig> shape_preset(const std::string& name) {
  for (const ShapeConfig& c : presets())
    if (c.name == name) return c;
  return std::nullopt;
}

std::string shape_manifest_json(const ShapeConfig& config) {
  ShapeConfig c = config;
  check(c);
  if (c.head_dim == 0) c.head_dim = c.d_model / c.heads;
  const int64_t s = c.seq, d = c.d_model;
  json regions = json::array();
  json embed = region("embed", "embedding", {param("tok_embeddings", {c.vocab, d})}, {memory(2 * s * d)}, s, d);
  embed["input"] = act({s}, "int64");
  estimate_memory(embed, s * d, 0, 0);
  regions.push_back(embed);
  json seq = {"embed"};
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = fmt::format("layers.{}", i);
    regions.push_back({{"name", p}, {"kind", "block"}, {"module", p}, {"input", act({s, d})}, {"output", act({s, d})}});
    regions.push_back(c.q_lora > 0 ? mla_attention(c, p) : gqa_attention(c, p));
    if (c.experts > 0 && i >= c.dense_layers) moe_layer(c, p, regions);
    else regions.push_back(swiglu(p + ".mlp", "mlp", s, d, c.ffn, s, true));
    seq.push_back(p);
  }
  // The loss: logits, their softmax and its gradient, fp32 (read and written twice).
  json head = region("head", "lm_head", {param("norm", {d}), param("output", {c.vocab, d})},
                     {memory(2 * s * d), gemm(s, c.vocab, d), memory(4 * s * c.vocab)}, s, d);
  head["output"] = act({s, c.vocab});
  estimate_memory(head, 2 * s * d + s * c.vocab, 0, s * c.vocab);
  regions.push_back(head);
  seq.push_back("head");
  json cfg = {{"layers", c.layers}, {"d_model", d}, {"heads", c.heads}, {"kv_heads", c.kv_heads}, {"head_dim", c.head_dim},
              {"ffn", c.ffn}, {"vocab", c.vocab}, {"seq", s}};
  if (c.experts > 0)
    cfg.update({{"experts", c.experts}, {"top_k", c.top_k}, {"shared_experts", c.shared_experts}, {"expert_ffn", c.expert_ffn},
                {"dense_layers", c.dense_layers}});
  if (c.q_lora > 0)
    cfg.update({{"q_lora", c.q_lora}, {"kv_lora", c.kv_lora}, {"qk_rope_dim", c.qk_rope_dim}, {"qk_nope_dim", c.qk_nope_dim},
                {"v_head_dim", c.v_head_dim}});
  json out{{"format", "piper-manifest"},
           {"version", 1},
           {"model", {{"name", c.name.empty() ? fmt::format("{}-{}L", c.family, c.layers) : c.name}, {"arch", c.family},
                      {"config", cfg}, {"shape_only", true}}},
           {"input", act({s}, "int64")},
           {"loss", "cross_entropy(head output [batch, seq, vocab], next tokens [batch, seq])"},
           {"sequence", seq},
           {"regions", regions}};
  if (c.tie_embeddings)  // the output projection is the token embedding (docs/manifest.md, ties)
    out["ties"] = json::array({json::array({json{{"region", "embed"}, {"param", "tok_embeddings"}},
                                            json{{"region", "head"}, {"param", "output"}}})});
  return out.dump(1) + "\n";
}

}  // namespace piper
