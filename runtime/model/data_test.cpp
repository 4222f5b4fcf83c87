#include "runtime/model/data.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

using piper::runtime::TokenData;
namespace fs = std::filesystem;

namespace {
fs::path temp(const std::string& name, const std::string& content) {
  fs::path p = fs::temp_directory_path() / ("piper-data-" + std::to_string(::getpid()) + "-" + name);
  std::ofstream(p, std::ios::binary) << content;
  return p;
}
}  // namespace

TEST_CASE("text is read as byte tokens, memory-mapped") {
  TokenData d(std::string(PIPER_SOURCE_DIR) + "/data/corpus.txt");
  CHECK(d.vocab() == 256);
  CHECK(d.size() > 100000);
  CHECK(d.token(0) == ' ');  // "                    GNU GENERAL PUBLIC LICENSE"
  CHECK(d.token(20) == 'G');
}

TEST_CASE("batches are deterministic, replicas read distinct slices, a resumed run reads the same") {
  TokenData d(std::string(PIPER_SOURCE_DIR) + "/data/corpus.txt");
  auto whole = d.batch(7, 3, 8, 0, 8, 16);
  REQUIRE(whole.size() == 8 * 17);
  // Two replicas of 4 samples each read exactly the two halves of the global batch.
  auto r0 = d.batch(7, 3, 8, 0, 4, 16), r1 = d.batch(7, 3, 8, 4, 4, 16);
  CHECK(std::equal(r0.begin(), r0.end(), whole.begin()));
  CHECK(std::equal(r1.begin(), r1.end(), whole.begin() + 4 * 17));
  CHECK(r0 != r1);
  // The same step again (a resumed run) gives the same tokens; another step or seed does not.
  CHECK(d.batch(7, 3, 8, 0, 8, 16) == whole);
  CHECK(d.batch(7, 4, 8, 0, 8, 16) != whole);
  CHECK(d.batch(8, 3, 8, 0, 8, 16) != whole);
  // Windows are contiguous text: sample 0's targets are its inputs shifted by one.
  std::vector<int64_t> s0(whole.begin(), whole.begin() + 17);
  bool found = false;
  for (size_t i = 0; i + 17 <= d.size() && !found; ++i) {
    bool same = true;
    for (size_t t = 0; t < 17 && same; ++t) same = d.token(i + t) == s0[t];
    found = same;
  }
  CHECK(found);
}

TEST_CASE("nanoGPT .bin files hold little-endian uint16 tokens") {
  std::string bytes;
  for (uint16_t t : {1, 2, 300, 65535, 7}) bytes += std::string{char(t & 0xff), char(t >> 8)};
  auto p = temp("tokens.bin", bytes);
  TokenData d(p.string());
  CHECK(d.vocab() == 65536);
  CHECK(d.size() == 5);
  CHECK(d.token(2) == 300);
  CHECK(d.token(3) == 65535);
  CHECK(d.max_token() == std::pair<int64_t, size_t>{65535, 3});
  auto b = d.batch(0, 0, 1, 0, 1, 3);
  CHECK(b.size() == 4);
  fs::remove(p);
}

TEST_CASE("bad data files get clear errors") {
  CHECK_THROWS_WITH_AS(TokenData("/nonexistent/corpus.txt"), doctest::Contains("cannot open"), std::runtime_error);
  auto odd = temp("odd.bin", "abc");
  CHECK_THROWS_WITH_AS(TokenData(odd.string()), doctest::Contains("not a whole number of uint16 tokens"), std::runtime_error);
  auto tiny = temp("tiny.txt", "abc");
  TokenData d(tiny.string());
  CHECK_THROWS_WITH_AS(d.batch(0, 0, 1, 0, 1, 8), doctest::Contains("fewer than one window"), std::runtime_error);
  CHECK_THROWS_WITH_AS(d.batch(0, 0, 4, 2, 4, 1), doctest::Contains("outside the global batch"), std::runtime_error);
  fs::remove(odd);
  fs::remove(tiny);
}
