// piper-train-ref: the plain single-device LibTorch training loop — the numerics oracle every
// distributed strategy is compared with, and the baseline for the runtime's overhead.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <torch/script.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/torch.h>

#include <fnmatch.h>

#include <chrono>
#include <fstream>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "runtime/model/data.h"
#include "tools/recipe_options.h"
#include "tools/run_file.h"

namespace {
struct RefArgs {
  std::string model_path, data_path, metrics_path, optimizer = "adamw", precision = "fp32", val_data;
  int64_t steps = 20, batch = 8, seq = 0, threads = 0, eval_every = 0, eval_batches = 8;
  double lr = 1e-3;
  piper::runtime::Recipe recipe;
  uint64_t seed = 0;
};

std::optional<int> parse(int argc, char** argv, RefArgs& a) {
  CLI::App app{"piper-train-ref: train a model.pt on one device with a plain LibTorch loop"};
  app.add_option("MODEL", a.model_path, "model.pt")->required();
  app.add_option("--data", a.data_path, "text file (byte tokens) or nanoGPT .bin (uint16 tokens)")->required();
  app.add_option("--steps", a.steps)->capture_default_str();
  app.add_option("--batch-size", a.batch, "samples per step")->capture_default_str();
  app.add_option("--seq-len", a.seq, "tokens per sample (default: the model's)");
  std::vector<double> betas;
  piper::add_recipe_options(app, a.lr, a.recipe, betas);
  app.add_option("--optimizer", a.optimizer, "adamw | sgd")->check(CLI::IsMember({"adamw", "sgd"}))->capture_default_str();
  app.add_option("--seed", a.seed, "data order seed")->capture_default_str();
  app.add_option("--metrics", a.metrics_path, "JSON lines, one per step");
  app.add_option("--val-data", a.val_data, "validation data: a forward-only pass in eval mode, as piper-run's");
  app.add_option("--eval-every", a.eval_every, "with --val-data: after every N steps and the last")->check(CLI::PositiveNumber);
  app.add_option("--eval-batches", a.eval_batches, "batches per validation (fixed windows)")->check(CLI::PositiveNumber);
  app.add_option("--threads", a.threads, "intra-op threads (default: LibTorch's)");
  app.add_option("--precision", a.precision, "fp32, or bf16: bf16 compute and activations, fp32 master weights and optimizer")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  std::string write_config;
  auto run_file = piper::TomlRunFile::install(app, write_config);  // the same run files piper-run reads
  run_file->find_path(argc, argv);
  try {
    app.parse(argc, argv);
    piper::check_recipe(a.optimizer, a.recipe, betas);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    fmt::print(stderr, "piper-train-ref: {}\n", run_file->locate(e.what()));
    return 2;
  }
  if (!run_file->write(app, write_config)) return 2;
  if (a.recipe.decay_steps <= 0) a.recipe.decay_steps = a.steps;
  return std::nullopt;
}

// A parameter's manifest name, "region.param", from its module path: the region whose module is the
// longest prefix of it (the manifest keeps each region's module path).
std::string manifest_name(const std::string& path, const nlohmann::json& manifest) {
  std::string best_module, best_region;
  for (const auto& r : manifest["regions"]) {
    const std::string mod = r.value("module", r["name"].get<std::string>());
    if (path.starts_with(mod + ".") && mod.size() > best_module.size()) {
      best_module = mod;
      best_region = r["name"].get<std::string>();
    }
  }
  return best_module.empty() ? path : best_region + path.substr(best_module.size());
}

// PyTorch's AdamW with nanoGPT's two groups: weight decay on parameters of two or more dimensions
// that no --no-decay glob names, none on the others; or SGD.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const RefArgs& a, const std::vector<torch::Tensor>& params,
                                                        const std::vector<std::string>& names) {
  if (a.optimizer != "adamw") return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(a.lr));
  std::vector<torch::Tensor> decay, no_decay;
  auto exempt = [&](const std::string& name) {
    return std::any_of(a.recipe.no_decay.begin(), a.recipe.no_decay.end(),
                       [&](const std::string& glob) { return fnmatch(glob.c_str(), name.c_str(), 0) == 0; });
  };
  for (size_t i = 0; i < params.size(); ++i) (params[i].dim() >= 2 && !exempt(names[i]) ? decay : no_decay).push_back(params[i]);
  auto options = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(a.lr)
                                                            .betas({a.recipe.beta1, a.recipe.beta2})
                                                            .eps(a.recipe.eps)
                                                            .weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decay.empty()) groups.emplace_back(decay, options(a.recipe.weight_decay));
  if (!no_decay.empty()) groups.emplace_back(no_decay, options(0.0));
  return std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(a.lr));
}

void set_lr(torch::optim::Optimizer& opt, const std::string& kind, double lr) {
  for (auto& g : opt.param_groups()) {
    if (kind == "adamw") static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
    else static_cast<torch::optim::SGDOptions&>(g.options()).lr(lr);
  }
}

// A tensor shared under two names (tied weights) is one parameter: stepped once, as PyTorch's own
// parameters() yields it.
std::vector<torch::Tensor> unique_parameters(const torch::jit::Module& model, std::vector<std::string>* names = nullptr) {
  std::vector<torch::Tensor> unique;
  std::set<const void*> seen;
  for (const auto& p : model.named_parameters())
    if (seen.insert(p.value.data_ptr()).second) {
      unique.push_back(p.value);
      if (names) names->push_back(p.name);
    }
  return unique;
}

// What the optimizer steps (fp32 masters) and what the model computes with (bf16 copies in mixed
// precision; the same tensors in fp32).
std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>> parameters(torch::jit::Module& model, bool bf16) {
  std::vector<torch::Tensor> params, compute;
  for (auto& p : unique_parameters(model)) params.push_back(p.detach().clone().requires_grad_(true));
  if (bf16) model.to(torch::kBFloat16);
  auto unique = unique_parameters(model);
  if (unique.size() != params.size())
    throw std::runtime_error("--precision bf16 unties tied weights (the cast copies each name's tensor); use fp32");
  for (auto p : unique) {
    p.set_requires_grad(true);
    compute.push_back(p);
  }
  if (!bf16) params = compute;
  return {params, compute};
}

// The mean loss over the first `batches` windows of `val` (piper-run's fixed validation set), in
// eval mode without a graph: what a PyTorch user's estimate_loss() does.
double evaluate(torch::jit::Module& model, const RefArgs& a, const piper::runtime::TokenData& val) {
  torch::NoGradGuard no_grad;
  model.eval();
  double total = 0;
  for (int64_t k = 0; k < a.eval_batches; ++k) {
    auto tokens = val.batch(a.seed, static_cast<uint64_t>(k), a.batch, 0, a.batch, a.seq);
    auto t = torch::from_blob(tokens.data(), {a.batch, a.seq + 1}, torch::kLong).clone();
    auto logits = model.forward({t.slice(1, 0, a.seq)}).toTensor().to(torch::kFloat);
    total += torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), t.slice(1, 1).reshape({-1}))
                 .item<double>();
  }
  model.train();
  return total / static_cast<double>(a.eval_batches);
}

int train(RefArgs a) {
  if (a.threads > 0) torch::set_num_threads(static_cast<int>(a.threads));
  std::unordered_map<std::string, std::string> extra{{"piper/manifest.json", ""}};
  torch::jit::setGraphExecutorOptimize(false);  // as the runtime runs regions (runtime/model/region_model.h)
  auto model = torch::jit::load(a.model_path, c10::nullopt, extra);
  model.train();
  const bool bf16 = a.precision == "bf16";
  auto [params, compute] = parameters(model, bf16);
  piper::runtime::TokenData data(a.data_path);
  if (a.seq <= 0) a.seq = nlohmann::json::parse(extra["piper/manifest.json"])["input"]["shape"][0].get<int64_t>();
  std::vector<std::string> names;  // the unique parameters' manifest names, for --no-decay
  const auto manifest = nlohmann::json::parse(extra["piper/manifest.json"]);
  unique_parameters(model, &names);
  for (auto& n : names) n = manifest_name(n, manifest);
  auto opt = make_optimizer(a, params, names);
  std::optional<piper::runtime::TokenData> val;
  if (!a.val_data.empty() && a.eval_every > 0) val.emplace(a.val_data);
  std::ofstream metrics;
  if (!a.metrics_path.empty()) metrics.open(a.metrics_path);
  for (int64_t step = 0; step < a.steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    const double lr = a.recipe.lr_at(a.lr, step);
    set_lr(*opt, a.optimizer, lr);
    auto tokens = data.batch(a.seed, static_cast<uint64_t>(step), a.batch, 0, a.batch, a.seq);
    auto t = torch::from_blob(tokens.data(), {a.batch, a.seq + 1}, torch::kLong).clone();
    auto logits = model.forward({t.slice(1, 0, a.seq)}).toTensor().to(torch::kFloat);  // the loss in fp32
    auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), t.slice(1, 1).reshape({-1}));
    opt->zero_grad();
    for (auto& p : compute)
      if (p.grad().defined()) p.mutable_grad().zero_();
    loss.backward();
    torch::NoGradGuard no_grad;
    if (bf16)
      for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = compute[i].grad().to(torch::kFloat);
    double norm = -1;  // PyTorch's own clipping (infinity: the norm measured, nothing clipped)
    if (a.recipe.clip_grad_norm > 0) norm = torch::nn::utils::clip_grad_norm_(params, a.recipe.clip_grad_norm);
    opt->step();
    if (bf16)
      for (size_t i = 0; i < params.size(); ++i) compute[i].copy_(params[i]);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fmt::print("step {:>4}  loss {:.6f}  {:.0f} tokens/s\n", step + 1, loss.item<double>(), double(a.batch * a.seq) / secs);
    std::string norm_key = norm >= 0 ? fmt::format("\"grad_norm\":{:.9g},", norm) : "";
    if (val && ((step + 1) % a.eval_every == 0 || step + 1 == a.steps))
      norm_key += fmt::format("\"val_loss\":{:.9g},", evaluate(model, a, *val));
    if (metrics.is_open())
      metrics << fmt::format("{{\"step\":{},\"loss\":{:.9g},\"lr\":{:.9g},{}\"tokens_per_s\":{:.1f},\"step_s\":{:.6f}}}\n",
                             step + 1, loss.item<double>(), lr, norm_key, double(a.batch * a.seq) / secs, secs);
  }
  double sum = 0, sumsq = 0;
  for (auto& p : params) {
    auto d = p.detach().to(torch::kDouble);
    sum += d.sum().item<double>();
    sumsq += (d * d).sum().item<double>();
  }
  if (metrics.is_open()) metrics << fmt::format("{{\"final_param_sum\":{:.12g},\"final_param_sumsq\":{:.12g}}}\n", sum, sumsq);
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  RefArgs a;
  if (auto rc = parse(argc, argv, a)) return *rc;
  try {
    return train(a);
  } catch (const std::exception& e) {
    fmt::print(stderr, "piper-train-ref: error: {}\n", e.what());
    return 1;
  }
}
