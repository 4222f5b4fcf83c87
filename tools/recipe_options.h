// The training recipe's command-line options, shared by piper-run and piper-train-ref so that both
// read a run the same way (header-only: tools have no library of their own).
#pragma once
#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "runtime/exec/recipe.h"

namespace piper {

inline void add_recipe_options(CLI::App& app, double& lr, runtime::Recipe& r, std::vector<double>& betas) {
  app.add_option("--lr", lr, "peak learning rate")->capture_default_str();
  app.add_option("--lr-schedule", r.schedule, "constant, or cosine | linear decay to --min-lr over the run's --steps")
      ->check(CLI::IsMember({"constant", "cosine", "linear"}))
      ->capture_default_str();
  app.add_option("--warmup-steps", r.warmup_steps, "steps the rate rises over first (nanoGPT's: lr * (step+1) / (warmup+1))")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--min-lr", r.min_lr, "the rate the decay ends at")->check(CLI::NonNegativeNumber);
  app.add_option("--decay-steps", r.decay_steps, "the step the decay reaches --min-lr at (default: --steps; pin it to "
                 "resume a run for longer on the same schedule)")->check(CLI::PositiveNumber);
  app.add_option("--betas", betas, "AdamW's beta1,beta2 (default 0.9,0.999)")->delimiter(',')->expected(2);
  app.add_option("--eps", r.eps, "AdamW's epsilon")->capture_default_str();
  app.add_option("--weight-decay", r.weight_decay,
                 "AdamW's decoupled weight decay on parameters of two or more dimensions (none on biases and norms)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--no-decay", r.no_decay, "globs over region.param names (the manifest's; a tied tensor by its first "
                 "name) exempt from weight decay, e.g. 'embed.*' (repeatable)")
      ->allow_extra_args(false);
  app.add_option("--clip-grad-norm", r.clip_grad_norm,
                 "clip the gradients to this global norm (every parameter counted once over all ranks, as "
                 "torch's clip_grad_norm_); inf measures and reports it without clipping")
      ->check(CLI::PositiveNumber);
}

// After parsing: the betas into the recipe, and what does not go together refused.
inline void check_recipe(const std::string& optimizer, runtime::Recipe& r, const std::vector<double>& betas) {
  if (!betas.empty()) {
    if (betas[0] < 0 || betas[0] >= 1 || betas[1] < 0 || betas[1] >= 1)
      throw CLI::ValidationError("--betas", "each beta must be in [0, 1)");
    r.beta1 = betas[0];
    r.beta2 = betas[1];
  }
  if (optimizer != "adamw" && (r.weight_decay > 0 || !betas.empty()))
    throw CLI::ValidationError("--weight-decay/--betas", "they are AdamW's: not with --optimizer " + optimizer);
}

}  // namespace piper
