// Training data: a text file (byte tokens, vocab 256) or a nanoGPT uint16 token file, memory-mapped,
// with deterministic windows per (seed, step, sample) so every replica reads its own distinct slice
// and a resumed run reads exactly what an uninterrupted one would.
#pragma once
#include <utility>
#include <cstdint>
#include <string>
#include <vector>

namespace piper::runtime {

class TokenData {
 public:
  // `.bin` files are nanoGPT's uint16 tokens; anything else is text read as bytes.
  explicit TokenData(const std::string& path);  // throws std::runtime_error with the reason
  ~TokenData();
  TokenData(const TokenData&) = delete;
  TokenData& operator=(const TokenData&) = delete;

  size_t size() const { return count_; }  // tokens
  int64_t vocab() const { return bytes_per_token_ == 1 ? 256 : 65536; }
  int64_t token(size_t i) const;
  // The largest token in the file and where it first occurs (one pass over the data).
  std::pair<int64_t, size_t> max_token() const;

  // The global batch of `step` has `global_batch` samples of `seq + 1` tokens (inputs and shifted
  // targets). This returns samples [first, first + count) of it, row-major.
  std::vector<int64_t> batch(uint64_t seed, uint64_t step, int64_t global_batch, int64_t first, int64_t count,
                             int64_t seq) const;

 private:
  const unsigned char* data_ = nullptr;
  size_t bytes_ = 0, count_ = 0;
  int bytes_per_token_ = 1;
  int fd_ = -1;
};

}  // namespace piper::runtime
