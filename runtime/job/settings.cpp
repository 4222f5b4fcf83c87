#include "runtime/job/settings.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace piper::runtime {

namespace {
// The keys are piper-run's option names, so a message names what to pass.
const char* const kRecipe[] = {"optimizer", "lr", "lr-schedule", "warmup-steps", "min-lr", "decay-steps",
                               "betas", "eps", "weight-decay", "clip-grad-norm"};
const char* const kData[] = {"data", "seed", "batch-size", "seq-len"};
}  // namespace

std::string run_settings(const TrainOptions& o) {
  const Recipe& r = o.recipe;
  nlohmann::json j{{"optimizer", o.optimizer}, {"lr", o.lr}, {"lr-schedule", r.schedule},
                   {"warmup-steps", r.warmup_steps}, {"betas", {r.beta1, r.beta2}}, {"eps", r.eps},
                   {"weight-decay", r.weight_decay}, {"clip-grad-norm", r.clip_grad_norm}, {"data", o.data_path},
                   {"seed", o.seed}, {"batch-size", o.batch}, {"seq-len", o.seq_len}};
  if (r.schedule != "constant") {  // where a decay ends matters only when there is one
    j["min-lr"] = r.min_lr;
    j["decay-steps"] = r.decay_steps > 0 ? r.decay_steps : o.steps;
  }
  return j.dump();
}

SettingsChanges compare_settings(const std::string& saved, const std::string& now) {
  const auto a = nlohmann::json::parse(saved), b = nlohmann::json::parse(now);
  SettingsChanges out;
  auto diff = [&](const char* key, std::vector<std::string>& into) {
    if (a.contains(key) && b.contains(key) && a[key] != b[key])
      into.push_back(fmt::format("--{} {} -> {}", key, a[key].dump(), b[key].dump()));
  };
  for (const char* k : kRecipe) diff(k, out.recipe);
  for (const char* k : kData) diff(k, out.data);
  return out;
}

}  // namespace piper::runtime
