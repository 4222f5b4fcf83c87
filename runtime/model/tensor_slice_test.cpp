#include "runtime/model/tensor_slice.h"

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

namespace piper::runtime {

TEST_CASE("tensor-parallel slices put back in their places rebuild the whole parameter") {
  // A fused q/k/v weight (3 blocks along dim 0) and a row-parallel projection (dim 1), over 2 and 4 ways.
  const torch::Tensor qkv = torch::arange(12 * 4, torch::kFloat).view({12, 4}), proj = torch::arange(4 * 8, torch::kFloat).view({4, 8});
  for (const auto& [whole, dim, blocks] : {std::tuple{qkv, 0, int64_t{3}}, std::tuple{proj, 1, int64_t{1}}})
    for (int64_t ways : {2, 4}) {
      torch::Tensor rebuilt = torch::full_like(whole, -1);
      for (int64_t c = 0; c < ways; ++c) {
        const SliceOf s{dim, blocks, ways, c, whole.sizes().vec()};
        const torch::Tensor part = take_slice(whole, s);
        CHECK(part.numel() == whole.numel() / ways);
        place_slice(rebuilt, part.view({-1}), s);  // flat, as a checkpoint holds it
        CHECK(slice_from_json(slice_json(s)) == s);
      }
      CHECK(torch::equal(rebuilt, whole));
    }
  // q's, k's and v's first rows go to coordinate 0 of 2: rows 0-1, 4-5 and 8-9.
  const torch::Tensor part = take_slice(qkv, SliceOf{0, 3, 2, 0, {12, 4}});
  CHECK(torch::equal(part.select(1, 0), torch::tensor({0.f, 4.f, 16.f, 20.f, 32.f, 36.f})));
}

TEST_CASE("a slice entry that does not fit its parameter is refused") {
  const nlohmann::json ok = slice_json(SliceOf{0, 3, 2, 1, {12, 4}});
  CHECK_NOTHROW(slice_from_json(ok));
  for (const auto& [key, value] : {std::pair{"coord", nlohmann::json(2)}, std::pair{"dim", nlohmann::json(2)},
                                   std::pair{"ways", nlohmann::json(5)}, std::pair{"shape", nlohmann::json("12x4")}}) {
    nlohmann::json bad = ok;
    bad[key] = value;
    CHECK_THROWS_AS(slice_from_json(bad), std::runtime_error);
  }
}

}  // namespace piper::runtime
