#include "runtime/exec/recipe.h"

#include <doctest/doctest.h>

using piper::runtime::Recipe;

TEST_CASE("the learning-rate schedule: warmup, then cosine or linear decay to the floor, as nanoGPT's") {
  Recipe r;
  CHECK(r.lr_at(1e-3, 0) == 1e-3);  // constant
  CHECK(r.lr_at(1e-3, 99) == 1e-3);
  r.warmup_steps = 4;
  r.min_lr = 1e-4;
  r.decay_steps = 14;
  CHECK(r.lr_at(1e-3, 0) == doctest::Approx(1e-3 / 5));  // (it + 1) / (warmup + 1)
  CHECK(r.lr_at(1e-3, 3) == doctest::Approx(4e-3 / 5));
  CHECK(r.lr_at(1e-3, 4) == doctest::Approx(1e-3));  // constant after warmup
  r.schedule = "cosine";
  CHECK(r.lr_at(1e-3, 4) == doctest::Approx(1e-3));
  CHECK(r.lr_at(1e-3, 9) == doctest::Approx(5.5e-4));  // halfway: the mean of peak and floor
  CHECK(r.lr_at(1e-3, 14) == doctest::Approx(1e-4));
  CHECK(r.lr_at(1e-3, 20) == doctest::Approx(1e-4));
  r.schedule = "linear";
  CHECK(r.lr_at(1e-3, 9) == doctest::Approx(5.5e-4));
  CHECK(r.lr_at(1e-3, 6) == doctest::Approx(1e-3 - 0.2 * 9e-4));
}
