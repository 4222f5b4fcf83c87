// piper-train-ref: the plain single-device LibTorch training loop — the numerics oracle every
// distributed strategy is compared with, and the baseline for the runtime's overhead.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <torch/script.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/torch.h>

#include <chrono>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "runtime/data.h"

int main(int argc, char** argv) {
  CLI::App app{"piper-train-ref: train a model.pt on one device with a plain LibTorch loop"};
  std::string model_path, data_path, metrics_path, optimizer = "adamw", precision = "fp32";
  int64_t steps = 20, batch = 8, seq = 0, threads = 0;
  double lr = 1e-3;
  uint64_t seed = 0;
  app.add_option("MODEL", model_path, "model.pt")->required();
  app.add_option("--data", data_path, "text file (byte tokens) or nanoGPT .bin (uint16 tokens)")->required();
  app.add_option("--steps", steps)->capture_default_str();
  app.add_option("--batch-size", batch, "samples per step")->capture_default_str();
  app.add_option("--seq-len", seq, "tokens per sample (default: the model's)");
  app.add_option("--lr", lr)->capture_default_str();
  app.add_option("--optimizer", optimizer, "adamw | sgd")->check(CLI::IsMember({"adamw", "sgd"}))->capture_default_str();
  app.add_option("--seed", seed, "data order seed")->capture_default_str();
  app.add_option("--metrics", metrics_path, "JSON lines, one per step");
  app.add_option("--threads", threads, "intra-op threads (default: LibTorch's)");
  app.add_option("--precision", precision, "fp32, or bf16: bf16 compute and activations, fp32 master weights and optimizer")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    if (threads > 0) torch::set_num_threads(static_cast<int>(threads));
    std::unordered_map<std::string, std::string> extra{{"piper/manifest.json", ""}};
    torch::jit::setGraphExecutorOptimize(false);  // as the runtime runs regions (runtime/region_model.h)
    auto model = torch::jit::load(model_path, c10::nullopt, extra);
    model.train();
    // Mixed precision: the optimizer steps fp32 masters; the model computes with bf16 copies.
    const bool bf16 = precision == "bf16";
    std::vector<torch::Tensor> params, compute;
    // A tensor shared under two names (tied weights) is one parameter: stepped once, as PyTorch's
    // own parameters() yields it.
    std::vector<torch::Tensor> unique;
    std::set<const void*> seen;
    for (auto p : model.parameters())
      if (seen.insert(p.data_ptr()).second) unique.push_back(p);
    for (auto& p : unique) params.push_back(p.detach().clone().requires_grad_(true));
    if (bf16) {
      model.to(torch::kBFloat16);
      unique.clear();
      seen.clear();
      for (auto p : model.parameters())
        if (seen.insert(p.data_ptr()).second) unique.push_back(p);
    }
    if (unique.size() != params.size())
      throw std::runtime_error("--precision bf16 unties tied weights (the cast copies each name's tensor); use fp32");
    for (auto p : unique) {
      p.set_requires_grad(true);
      compute.push_back(p);
    }
    if (!bf16) params = compute;
    piper::runtime::TokenData data(data_path);
    if (seq <= 0) {
      auto m = nlohmann::json::parse(extra["piper/manifest.json"]);
      seq = m["input"]["shape"][0].get<int64_t>();
    }
    std::unique_ptr<torch::optim::Optimizer> opt;
    if (optimizer == "adamw") opt = std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(lr).weight_decay(0.0));
    else opt = std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(lr));
    std::ofstream metrics;
    if (!metrics_path.empty()) metrics.open(metrics_path);
    for (int64_t step = 0; step < steps; ++step) {
      auto t0 = std::chrono::steady_clock::now();
      auto tokens = data.batch(seed, static_cast<uint64_t>(step), batch, 0, batch, seq);
      auto t = torch::from_blob(tokens.data(), {batch, seq + 1}, torch::kLong).clone();
      auto logits = model.forward({t.slice(1, 0, seq)}).toTensor().to(torch::kFloat);  // the loss in fp32
      auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), t.slice(1, 1).reshape({-1}));
      opt->zero_grad();
      for (auto& p : compute)
        if (p.grad().defined()) p.mutable_grad().zero_();
      loss.backward();
      if (bf16) {
        torch::NoGradGuard no_grad;
        for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = compute[i].grad().to(torch::kFloat);
      }
      opt->step();
      if (bf16) {
        torch::NoGradGuard no_grad;
        for (size_t i = 0; i < params.size(); ++i) compute[i].copy_(params[i]);
      }
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      fmt::print("step {:>4}  loss {:.6f}  {:.0f} tokens/s\n", step + 1, loss.item<double>(), double(batch * seq) / secs);
      if (metrics.is_open())
        metrics << fmt::format("{{\"step\":{},\"loss\":{:.9g},\"tokens_per_s\":{:.1f},\"step_s\":{:.6f}}}\n", step + 1,
                               loss.item<double>(), double(batch * seq) / secs, secs);
    }
    double sum = 0, sumsq = 0;
    for (auto& p : params) {
      auto d = p.detach().to(torch::kDouble);
      sum += d.sum().item<double>();
      sumsq += (d * d).sum().item<double>();
    }
    if (metrics.is_open()) metrics << fmt::format("{{\"final_param_sum\":{:.12g},\"final_param_sumsq\":{:.12g}}}\n", sum, sumsq);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "piper-train-ref: error: {}\n", e.what());
    return 1;
  }
}
