// The training recipe around the optimizer step: AdamW's settings, weight decay on the matrices,
// and the learning-rate schedule (nanoGPT's: linear warmup, then cosine or linear decay to a floor).
#pragma once
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace piper::runtime {

struct Recipe {
  std::string schedule = "constant";  // constant | cosine | linear
  int64_t warmup_steps = 0;           // the learning rate rises over these steps first
  double min_lr = 0;                  // where the decay ends
  int64_t decay_steps = 0;            // the step the decay reaches min_lr at (the run's --steps)
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // AdamW's (torch's defaults)
  // AdamW's decoupled weight decay, on parameters of two or more dimensions only (matrices and
  // embeddings; biases and norms' gains have one): nanoGPT's rule.
  double weight_decay = 0;
  // Parameters exempt from it although they have two dimensions (embeddings, say): globs over
  // "region.param" names, a tied tensor by its first name (--no-decay, or `no-decay = [...]` in a run file).
  std::vector<std::string> no_decay;
  // Clipping by the global gradient norm (torch's clip_grad_norm_): 0 off; infinity measures and
  // reports the norm without clipping.
  double clip_grad_norm = 0;

  // The learning rate of 0-based `step` for peak rate `lr`.
  double lr_at(double lr, int64_t step) const {
    if (warmup_steps > 0 && step < warmup_steps) return lr * double(step + 1) / double(warmup_steps + 1);
    if (schedule == "constant" || decay_steps <= warmup_steps) return lr;
    if (step >= decay_steps) return min_lr;
    const double ratio = double(step - warmup_steps) / double(decay_steps - warmup_steps);
    const double coeff = schedule == "cosine" ? 0.5 * (1.0 + std::cos(M_PI * ratio)) : 1.0 - ratio;
    return min_lr + coeff * (lr - min_lr);
  }
};

}  // namespace piper::runtime
