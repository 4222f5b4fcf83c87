#include "runtime/model/data.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace piper::runtime {

namespace {
// SplitMix64: a stateless hash, so sample k of step s is the same wherever and whenever it is drawn.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

TokenData::TokenData(const std::string& path) {
  fd_ = ::open(path.c_str(), O_RDONLY);
  if (fd_ < 0) throw std::runtime_error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw std::runtime_error(fmt::format("{}: not a regular file", path));
  }
  bytes_ = static_cast<size_t>(st.st_size);
  bytes_per_token_ = path.size() > 4 && path.substr(path.size() - 4) == ".bin" ? 2 : 1;
  if (bytes_ % static_cast<size_t>(bytes_per_token_) != 0) {
    ::close(fd_);
    throw std::runtime_error(fmt::format("{}: {} bytes is not a whole number of uint16 tokens", path, bytes_));
  }
  count_ = bytes_ / static_cast<size_t>(bytes_per_token_);
  if (bytes_ > 0) {
    void* p = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd_, 0);
    if (p == MAP_FAILED) {
      ::close(fd_);
      throw std::runtime_error(fmt::format("{}: cannot map: {}", path, std::strerror(errno)));
    }
    data_ = static_cast<const unsigned char*>(p);
  }
}

TokenData::~TokenData() {
  if (data_) ::munmap(const_cast<unsigned char*>(data_), bytes_);
  if (fd_ >= 0) ::close(fd_);
}

int64_t TokenData::token(size_t i) const {
  if (bytes_per_token_ == 1) return data_[i];
  uint16_t v;
  std::memcpy(&v, data_ + 2 * i, 2);  // nanoGPT writes little-endian uint16, as this machine is
  return v;
}

std::pair<int64_t, size_t> TokenData::max_token() const {
  std::pair<int64_t, size_t> best{-1, 0};
  for (size_t i = 0; i < count_; ++i)
    if (int64_t t = token(i); t > best.first) best = {t, i};
  return best;
}

std::vector<int64_t> TokenData::batch(uint64_t seed, uint64_t step, int64_t global_batch, int64_t first,
                                      int64_t count, int64_t seq) const {
  if (first < 0 || count < 0 || first + count > global_batch)
    throw std::runtime_error(fmt::format("samples [{}, {}) are outside the global batch of {}", first, first + count, global_batch));
  if (count_ < static_cast<size_t>(seq) + 1)
    throw std::runtime_error(fmt::format("the data has {} tokens, fewer than one window of {}", count_, seq + 1));
  const uint64_t windows = count_ - static_cast<size_t>(seq);  // valid window starts
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(count * (seq + 1)));
  for (int64_t k = first; k < first + count; ++k) {
    uint64_t sample = step * static_cast<uint64_t>(global_batch) + static_cast<uint64_t>(k);
    size_t start = static_cast<size_t>(mix(mix(seed) ^ sample) % windows);
    for (int64_t t = 0; t <= seq; ++t) out.push_back(token(start + static_cast<size_t>(t)));
  }
  return out;
}

}  // namespace piper::runtime
