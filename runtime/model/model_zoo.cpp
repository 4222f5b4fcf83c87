#include "runtime/model/model_zoo.h"
#include "runtime/model/region_memory.h"
#include "runtime/model/region_model.h"

#include <fmt/format.h>
#include <torch/script.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace piper::runtime {

using nlohmann::json;

namespace {
json param(const std::string& name, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return json{{"name", name}, {"shape", shape}, {"dtype", "float32"}, {"bytes", n * 4}};
}
// A parameter tensor parallelism cuts along `dim` (in `blocks` equal blocks: 3 for fused q, k, v).
json sharded(json p, int64_t dim, int64_t blocks = 1) {
  p["shard"] = {{"dim", dim}, {"blocks", blocks}};
  return p;
}
json act(std::vector<int64_t> shape, const char* dtype = "float32") { return json{{"shape", shape}, {"dtype", dtype}}; }
int64_t linear_flops(int64_t t, int64_t in, int64_t out) { return 2 * t * in * out; }

void check(const ModelConfig& c) {
  if (c.arch != "gpt" && c.arch != "moe") throw std::runtime_error("unknown architecture '" + c.arch + "' (gpt or moe)");
  if (c.layers < 1 || c.d_model < 1 || c.heads < 1 || c.ffn < 1 || c.vocab < 1 || c.seq < 1)
    throw std::runtime_error("sizes must be positive");
  if (c.d_model % c.heads != 0)
    throw std::runtime_error(fmt::format("--d-model {} is not divisible by --heads {}", c.d_model, c.heads));
  if (c.arch == "moe" && (c.experts < 1 || c.top_k < 1 || c.top_k > c.experts))
    throw std::runtime_error(fmt::format("--top-k must be in 1..--experts ({}), got {}", c.experts, c.top_k));
  if (c.capacity_factor < 0 || !std::isfinite(c.capacity_factor))
    throw std::runtime_error(fmt::format("--capacity-factor must be positive (or 0: dropless), got {}", c.capacity_factor));
  if (c.capacity_factor > 0 && c.arch != "moe") throw std::runtime_error("--capacity-factor is for moe models");
}

// Tokens of a model-length sequence each expert may take (0: no limit), for the manifest; the router
// computes the same from the length it gets. The router always sees whole sequences
// (sequence and context shards are gathered before it, runtime/exec/chunk_runner.cpp), and a
// microbatch holds whole sequences, so a capacity per sequence routes alike in every plan.
int64_t expert_capacity(const ModelConfig& c) {
  if (c.capacity_factor <= 0) return 0;
  // In the router's order of operations, so that both round alike.
  const double cap = std::ceil(c.capacity_factor * double(c.seq) * double(c.top_k) / double(c.experts));
  return cap >= double(c.seq) ? 0 : static_cast<int64_t>(cap);  // a whole sequence fits: nothing to drop
}
}  // namespace

std::string manifest_json(const ModelConfig& c) {
  check(c);
  const int64_t t = c.seq, d = c.d_model;
  json regions = json::array();
  regions.push_back({{"name", "embed"}, {"kind", "embedding"}, {"module", "embed"},
                     {"params", {param("wte", {c.vocab, d}), param("wpe", {c.seq, d})}},
                     {"input", act({c.seq}, "int64")}, {"output", act({c.seq, d})}, {"flops", 0}});
  json seq = {"embed"};
  for (int64_t i = 0; i < c.layers; ++i) {
    std::string p = fmt::format("layers.{}", i), mod = fmt::format("layers_{}", i);
    regions.push_back({{"name", p}, {"kind", "block"}, {"module", mod}, {"input", act({c.seq, d})}, {"output", act({c.seq, d})}});
    regions.push_back({{"name", p + ".attn"}, {"kind", "attention"}, {"module", mod + ".attn"},
                       {"params", {param("ln_1_weight", {d}), param("ln_1_bias", {d}), sharded(param("c_attn_weight", {3 * d, d}), 0, 3),
                                   sharded(param("c_attn_bias", {3 * d}), 0, 3), sharded(param("c_proj_weight", {d, d}), 1),
                                   param("c_proj_bias", {d})}},
                       {"tp", {{"dim", "heads"}, {"count", c.heads}}}, {"cp", "attention"},
                       {"input", act({c.seq, d})}, {"output", act({c.seq, d})},
                       {"flops", linear_flops(t, d, 3 * d) + linear_flops(t, d, d) + 4 * t * t * d}});
    if (c.arch == "gpt") {
      regions.push_back({{"name", p + ".mlp"}, {"kind", "mlp"}, {"module", mod + ".mlp"},
                         {"params", {param("ln_2_weight", {d}), param("ln_2_bias", {d}), sharded(param("c_fc_weight", {c.ffn, d}), 0),
                                     sharded(param("c_fc_bias", {c.ffn}), 0), sharded(param("c_proj_weight", {d, c.ffn}), 1),
                                     param("c_proj_bias", {d})}},
                         {"tp", {{"dim", "hidden"}, {"count", c.ffn}}}, {"cp", "tokenwise"},
                         {"input", act({c.seq, d})}, {"output", act({c.seq, d})},
                         {"flops", linear_flops(t, d, c.ffn) + linear_flops(t, c.ffn, d)}});
    } else {
      regions.push_back({{"name", p + ".moe.router"}, {"kind", "router"}, {"module", mod + ".moe.router"},
                         {"params", {param("ln_2_weight", {d}), param("ln_2_bias", {d}), param("weight", {c.experts, d})}},
                         {"input", act({c.seq, d})}, {"output", act({c.seq, c.experts})},
                         {"flops", linear_flops(t, d, c.experts)}});
      for (int64_t j = 0; j < c.experts; ++j)
        regions.push_back({{"name", fmt::format("{}.moe.experts.{}", p, j)}, {"kind", "expert"},
                           {"module", fmt::format("{}.moe.experts_{}", mod, j)},
                           {"params", {param("c_fc_weight", {c.ffn, d}), param("c_fc_bias", {c.ffn}),
                                       param("c_proj_weight", {d, c.ffn}), param("c_proj_bias", {d})}},
                           // Per sample an expert sees on average top_k/experts of the tokens.
                           {"input", act({c.seq, d})}, {"output", act({c.seq, d})},
                           {"flops", (linear_flops(t, d, c.ffn) + linear_flops(t, c.ffn, d)) * c.top_k / c.experts}});
    }
    seq.push_back(p);
  }
  regions.push_back({{"name", "head"}, {"kind", "lm_head"}, {"module", "head"},
                     {"params", {param("ln_f_weight", {d}), param("ln_f_bias", {d}), param("lm_head_weight", {c.vocab, d})}},
                     {"input", act({c.seq, d})}, {"output", act({c.seq, c.vocab})}, {"flops", linear_flops(t, d, c.vocab)}});
  seq.push_back("head");
  json config = {{"layers", c.layers}, {"d_model", d}, {"heads", c.heads}, {"ffn", c.ffn}, {"vocab", c.vocab}, {"seq", c.seq}};
  if (c.arch == "moe") config.update({{"experts", c.experts}, {"top_k", c.top_k}});
  if (c.capacity_factor > 0) config.update({{"capacity_factor", c.capacity_factor}, {"expert_capacity", expert_capacity(c)}});
  if (c.tie_embeddings) config["tie_embeddings"] = true;
  json out{{"format", "piper-manifest"},
              {"version", 1},
              {"model", {{"name", c.name.empty() ? fmt::format("{}-{}L", c.arch, c.layers) : c.name}, {"arch", c.arch},
                         {"config", config}}},
              {"input", act({c.seq}, "int64")},
              {"loss", "cross_entropy(head output [batch, seq, vocab], next tokens [batch, seq])"},
              {"sequence", seq},
              {"regions", regions}};
  if (c.tie_embeddings) {
    const json wte = {{"region", "embed"}, {"param", "wte"}}, proj = {{"region", "head"}, {"param", "lm_head_weight"}};
    out["ties"] = json::array();
    out["ties"].push_back(json::array({wte, proj}));
  }
  return out.dump(1) + "\n";
}

namespace {
using torch::jit::Module;

// Each region is a module of its own TorchScript class; mangling keeps the class names unique.
Module make(const std::shared_ptr<torch::jit::CompilationUnit>& cu, const char* cls) {
  return Module(c10::QualifiedName(std::string("__torch__.piper.") + cls), cu, /*shouldMangle=*/true);
}

// GPT-2 initialisation: N(0, 0.02) weights, zero biases, unit layer norms; residual projections
// scaled by 1/sqrt(2 * layers).
torch::Tensor normal(std::vector<int64_t> shape, double std) { return torch::randn(shape) * std; }

// Parameters require grad, so that the saved model.pt trains in PyTorch as it loads.
void add_params(Module& m, const std::vector<std::pair<std::string, torch::Tensor>>& params) {
  for (const auto& [name, t] : params) m.register_parameter(name, t.detach().requires_grad_(true), false);
}

// The context-parallel contract (docs/models.md): cp_qkv, the heads' scaled queries, keys and values
// of the tokens given; cp_exit, the residual plus the projection of their attention's output.
// The tensor-parallel contract (docs/models.md): a replicated entry (the norm), a part that runs on
// this rank's heads alone and returns its partial projection (no bias), and the exit that adds the
// reduced partials, the bias and the residual. Head counts come from the weights' shapes, so the
// same code runs on a rank's slice. `forward` computes the same with the bias fused into the
// projection, as before the contract existed (bf16 rounds each op: one op fewer keeps its numbers).
const char* kAttention = R"(
def tp_enter(self, x):
    return torch.layer_norm(x, [x.size(2)], self.ln_1_weight, self.ln_1_bias, 1e-5)

def heads(self, h):
    B = h.size(0)
    T = h.size(1)
    C = self.c_attn_weight.size(0) // 3
    qkv = torch.linear(h, self.c_attn_weight, self.c_attn_bias)
    q, k, v = qkv.split(C, 2)
    hd = self.head_dim
    q = q.view(B, T, -1, hd).transpose(1, 2)
    k = k.view(B, T, -1, hd).transpose(1, 2)
    v = v.view(B, T, -1, hd).transpose(1, 2)
    att = torch.matmul(q, k.transpose(-2, -1)) * self.scale
    causal = torch.tril(torch.ones(T, T, device=h.device)) == 0
    att = torch.softmax(att.masked_fill(causal, -1e30), -1)
    return torch.matmul(att, v).transpose(1, 2).contiguous().view(B, T, C)

def tp_partial(self, h):
    return torch.linear(self.heads(h), self.c_proj_weight)

def tp_exit(self, x, s):
    return x + (s + self.c_proj_bias)

def cp_qkv(self, x):
    h = self.tp_enter(x)
    B = h.size(0)
    T = h.size(1)
    C = self.c_attn_weight.size(0) // 3
    q, k, v = torch.linear(h, self.c_attn_weight, self.c_attn_bias).split(C, 2)
    hd = self.head_dim
    q = q.view(B, T, -1, hd).transpose(1, 2) * self.scale
    return q, k.view(B, T, -1, hd).transpose(1, 2), v.view(B, T, -1, hd).transpose(1, 2)

def cp_exit(self, x, y):
    B = y.size(0)
    T = y.size(2)
    return x + torch.linear(y.transpose(1, 2).contiguous().view(B, T, -1), self.c_proj_weight, self.c_proj_bias)

def forward(self, x):
    return x + torch.linear(self.heads(self.tp_enter(x)), self.c_proj_weight, self.c_proj_bias)
)";

const char* kMlp = R"(
def tp_enter(self, x):
    return torch.layer_norm(x, [x.size(2)], self.ln_2_weight, self.ln_2_bias, 1e-5)

def tp_partial(self, h):
    return torch.linear(torch.gelu(torch.linear(h, self.c_fc_weight, self.c_fc_bias)), self.c_proj_weight)

def tp_exit(self, x, s):
    return x + (s + self.c_proj_bias)

def forward(self, x):
    h = self.tp_enter(x)
    return x + torch.linear(torch.gelu(torch.linear(h, self.c_fc_weight, self.c_fc_bias)), self.c_proj_weight, self.c_proj_bias)
)";

// An expert maps normalised hidden states to its output (no residual: the MoE block adds it).
const char* kExpert = R"(
def forward(self, h):
    return torch.linear(torch.gelu(torch.linear(h, self.c_fc_weight, self.c_fc_bias)), self.c_proj_weight, self.c_proj_bias)
)";

// The router normalises the block input and returns it with each token's gate per expert:
// softmax over experts, keep the top k, renormalise; unchosen experts get 0. With a capacity, each
// expert then keeps the ceil(capacity_factor * tokens * top_k / experts) tokens of each sequence
// (dimension 1; piper-run --seq-len may shorten it) whose probability for it is highest; its gate is 0 for the rest (their other choices keep theirs, not renormalised, as
// Megatron drops). The mask multiplies, so a dropped gate passes no gradient, whether the expert
// ran on the token (dense evaluation) or never saw it (expert parallelism sends only nonzero gates).
const char* kRouter = R"(
def forward(self, x):
    h = torch.layer_norm(x, [x.size(2)], self.ln_2_weight, self.ln_2_bias, 1e-5)
    probs = torch.softmax(torch.linear(h, self.weight), -1)
    top = torch.topk(probs, self.top_k, -1)
    kept = torch.zeros_like(probs).scatter(-1, top[1], top[0])
    gates = kept / kept.sum(-1, keepdim=True)
    if self.capacity_factor > 0.0:
        exact = self.capacity_factor * x.size(1) * self.top_k / probs.size(-1)
        capacity = int(exact)
        if float(capacity) < exact:
            capacity += 1
        if capacity < x.size(1):
            first = torch.topk(kept, capacity, 1)[1]
            gates = gates * torch.zeros_like(kept).scatter(1, first, 1.0)
    return h, gates
)";

const char* kEmbed = R"(
def forward(self, idx):
    pos = torch.arange(idx.size(1), device=idx.device)
    return torch.embedding(self.wte, idx) + torch.embedding(self.wpe, pos)
)";

const char* kHead = R"(
def forward(self, x):
    h = torch.layer_norm(x, [x.size(2)], self.ln_f_weight, self.ln_f_bias, 1e-5)
    return torch.linear(h, self.lm_head_weight)
)";
}  // namespace

namespace {
// The TorchScript module of a configuration, weights initialised from the seed.
Module build(const ModelConfig& c) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(c.seed);
  auto cu = std::make_shared<torch::jit::CompilationUnit>();
  const int64_t d = c.d_model;
  const double resid = 0.02 / std::sqrt(2.0 * double(c.layers));

  Module root = make(cu, "Model");
  Module embed = make(cu, "Embed");
  add_params(embed, {{"wte", normal({c.vocab, d}, 0.02)}, {"wpe", normal({c.seq, d}, 0.01)}});
  embed.define(kEmbed);
  root.register_module("embed", embed);

  std::string body = "def forward(self, idx):\n    x = self.embed.forward(idx)\n";
  for (int64_t i = 0; i < c.layers; ++i) {
    Module block = make(cu, "Block");
    Module attn = make(cu, "Attention");
    add_params(attn, {{"ln_1_weight", torch::ones({d})}, {"ln_1_bias", torch::zeros({d})},
                      {"c_attn_weight", normal({3 * d, d}, 0.02)}, {"c_attn_bias", torch::zeros({3 * d})},
                      {"c_proj_weight", normal({d, d}, resid)}, {"c_proj_bias", torch::zeros({d})}});
    attn.register_attribute("head_dim", c10::IntType::get(), c10::IValue(d / c.heads));
    attn.register_attribute("scale", c10::FloatType::get(), c10::IValue(1.0 / std::sqrt(double(d / c.heads))));
    attn.define(kAttention);
    block.register_module("attn", attn);
    if (c.arch == "gpt") {
      Module mlp = make(cu, "Mlp");
      add_params(mlp, {{"ln_2_weight", torch::ones({d})}, {"ln_2_bias", torch::zeros({d})},
                       {"c_fc_weight", normal({c.ffn, d}, 0.02)}, {"c_fc_bias", torch::zeros({c.ffn})},
                       {"c_proj_weight", normal({d, c.ffn}, resid)}, {"c_proj_bias", torch::zeros({d})}});
      mlp.define(kMlp);
      block.register_module("mlp", mlp);
      block.define("def forward(self, x):\n    return self.mlp.forward(self.attn.forward(x))\n");
    } else {
      Module moe = make(cu, "Moe");
      Module router = make(cu, "Router");
      add_params(router, {{"ln_2_weight", torch::ones({d})}, {"ln_2_bias", torch::zeros({d})},
                          {"weight", normal({c.experts, d}, 0.02)}});
      router.register_attribute("top_k", c10::IntType::get(), c10::IValue(c.top_k));
      router.register_attribute("capacity_factor", c10::FloatType::get(), c10::IValue(c.capacity_factor));
      router.define(kRouter);
      moe.register_module("router", router);
      // Dense evaluation: every expert sees every token, weighted by its gate (0 if not chosen).
      // Exactly the sparse top-k result; the runtime's expert parallelism dispatches instead.
      std::string moe_body = "def forward(self, x):\n    h, gates = self.router.forward(x)\n    y = torch.zeros_like(h)\n";
      for (int64_t j = 0; j < c.experts; ++j) {
        Module expert = make(cu, "Expert");
        add_params(expert, {{"c_fc_weight", normal({c.ffn, d}, 0.02)}, {"c_fc_bias", torch::zeros({c.ffn})},
                            {"c_proj_weight", normal({d, c.ffn}, resid)}, {"c_proj_bias", torch::zeros({d})}});
        expert.define(kExpert);
        moe.register_module(fmt::format("experts_{}", j), expert);
        moe_body += fmt::format("    y = y + gates[:, :, {}:{}] * self.experts_{}.forward(h)\n", j, j + 1, j);
      }
      moe_body += "    return x + y\n";
      moe.define(moe_body);
      block.register_module("moe", moe);
      block.define("def forward(self, x):\n    return self.moe.forward(self.attn.forward(x))\n");
    }
    root.register_module(fmt::format("layers_{}", i), block);
    body += fmt::format("    x = self.layers_{}.forward(x)\n", i);
  }
  Module head = make(cu, "Head");
  add_params(head, {{"ln_f_weight", torch::ones({d})}, {"ln_f_bias", torch::zeros({d})}});
  if (c.tie_embeddings)  // the very tensor, not a copy: TorchScript saves and loads it once
    head.register_parameter("lm_head_weight", embed.attr("wte").toTensor(), false);
  else
    add_params(head, {{"lm_head_weight", normal({c.vocab, d}, 0.02)}});
  head.define(kHead);
  root.register_module("head", head);
  body += "    return self.head.forward(x)\n";
  root.define(body);
  return root;
}
}  // namespace

void save_model(const ModelConfig& c, const std::string& path) {
  Module root = build(c);
  root.save(path, {{"piper/manifest.json", manifest_json(c)}});
  // Measure the regions' activation memory on the saved model, then save it again with the facts.
  root.save(path, {{"piper/manifest.json", measure_manifest(path)}});
}

std::string measured_manifest_json(const ModelConfig& c) {
  // A probe of the same shapes with one block measures what every block would.
  ModelConfig probe = c;
  probe.layers = 1;
  const auto path = std::filesystem::temp_directory_path() / fmt::format("piper-probe-{}.pt", ::getpid());
  build(probe).save(path.string(), {{"piper/manifest.json", manifest_json(probe)}});
  std::string out;
  try {
    out = measure_manifest_like(path.string(), manifest_json(c));
  } catch (...) {
    std::filesystem::remove(path);
    throw;
  }
  std::filesystem::remove(path);
  return out;
}

}  // namespace piper::runtime
