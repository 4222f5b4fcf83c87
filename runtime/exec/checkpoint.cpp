#include "runtime/exec/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

namespace piper::runtime {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
// 2 added tensor-parallel `slice` entries: a reader of version 1 would take a slice's range for the
// whole parameter's, so it must refuse them; this one reads both.
constexpr int kVersion = 2, kOldestReadable = 1;

uint64_t fnv1a(const char* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(p[i])) * 1099511628211ull;
  return h;
}

// Writes `bytes` to `path` and makes them durable before returning.
void write_durable(const fs::path& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw std::runtime_error(fmt::format("checkpoint: cannot create {}: {}", path.string(), std::strerror(errno)));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0) {
      ::close(fd);
      throw std::runtime_error(fmt::format("checkpoint: writing {}: {}", path.string(), std::strerror(errno)));
    }
    done += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0)
    throw std::runtime_error(fmt::format("checkpoint: syncing {}: {}", path.string(), std::strerror(errno)));
}

void sync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

std::string step_name(int64_t step) { return fmt::format("step-{:08d}", step); }

void append(std::string& out, const torch::Tensor& t) {
  const torch::Tensor c = t.detach().to(torch::kCPU, torch::kFloat).contiguous();  // from wherever it lives
  out.append(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.numel()) * sizeof(float));
}
}  // namespace

std::string write_checkpoint(const std::string& dir, int64_t step, const std::vector<StatePiece>& mine, json meta, int rank,
                             int world, const std::function<void()>& barrier) {
  const fs::path root(dir), tmp = root / ("." + step_name(step) + ".tmp"), final_path = root / step_name(step);
  if (rank == 0) {
    fs::create_directories(root);
    fs::remove_all(tmp);  // a save that died half-way
    fs::create_directories(tmp);
  }
  barrier();
  std::string bytes;
  json entries = json::array();
  for (const StatePiece& p : mine) {
    const size_t at = bytes.size();
    append(bytes, p.value);
    const bool moments = p.exp_avg.defined();
    if (moments) {
      append(bytes, p.exp_avg);
      append(bytes, p.exp_avg_sq);
    }
    entries.push_back({{"region", p.region}, {"param", p.param}, {"numel", p.numel}, {"begin", p.begin}, {"end", p.end},
                       {"file", fmt::format("rank-{:05d}.bin", rank)}, {"offset", at}, {"moments", moments},
                       {"hash", fmt::format("{:016x}", fnv1a(bytes.data() + at, bytes.size() - at))}});
    if (p.slice.sliced()) entries.back()["slice"] = slice_json(p.slice);  // begin and end count the slice's elements
  }
  write_durable(tmp / fmt::format("rank-{:05d}.bin", rank), bytes);
  write_durable(tmp / fmt::format("rank-{:05d}.json", rank), entries.dump());
  barrier();
  if (rank == 0) {
    json all = json::array();
    for (int r = 0; r < world; ++r) {
      const fs::path part = tmp / fmt::format("rank-{:05d}.json", r);
      std::ifstream in(part);
      for (auto& e : json::parse(in)) all.push_back(std::move(e));
      fs::remove(part);
    }
    meta["format"] = "piper-checkpoint";
    meta["version"] = kVersion;
    meta["step"] = step;
    meta["world"] = world;
    meta["entries"] = std::move(all);
    write_durable(tmp / "manifest.json", meta.dump(1));
    sync_dir(tmp);
    fs::remove_all(final_path);
    fs::rename(tmp, final_path);  // from here on the new checkpoint is the valid one
    sync_dir(root);
    for (const auto& e : fs::directory_iterator(root))  // then the older ones go
      if (const std::string name = e.path().filename().string(); name.starts_with("step-") && e.path() != final_path)
        fs::remove_all(e.path());
  }
  barrier();
  return final_path.string();
}

std::string latest_checkpoint(const std::string& dir) {
  const fs::path root(dir);
  if (fs::exists(root / "manifest.json")) return root.string();
  std::string best;
  if (fs::is_directory(root))
    for (const auto& e : fs::directory_iterator(root)) {
      const std::string name = e.path().filename().string();
      if (name.starts_with("step-") && fs::exists(e.path() / "manifest.json") && name > fs::path(best).filename().string())
        best = e.path().string();
    }
  if (best.empty())
    throw std::runtime_error(fmt::format("--resume {}: no complete checkpoint there (a step-N folder with a manifest.json)", dir));
  return best;
}

namespace {
json read_manifest(const fs::path& root) {
  const std::string path = root.string();
  json m;
  {
    std::ifstream in(root / "manifest.json");
    if (!in) throw std::runtime_error(fmt::format("checkpoint {}: cannot open manifest.json", path));
    m = json::parse(in, nullptr, false);
  }
  if (m.is_discarded() || !m.is_object() || m.value("format", "") != "piper-checkpoint" || !m.contains("entries"))
    throw std::runtime_error(fmt::format("checkpoint {}: manifest.json is not a Piper checkpoint manifest (corrupt?)", path));
  if (const int v = m.value("version", 0); v < kOldestReadable || v > kVersion)
    throw std::runtime_error(fmt::format("checkpoint {}: format version {}, this piper-run reads {} to {}", path, v, kOldestReadable,
                                         kVersion));
  return m;
}

// A checkpoint's entries, read from their files on first use and checked against their checksums.
class Entries {
 public:
  Entries(fs::path root, const json& entries) : root_(std::move(root)), e_(entries) {}
  const json& operator[](size_t i) const { return e_[i]; }
  std::string name(size_t i) const { return e_[i]["region"].get<std::string>() + "." + e_[i]["param"].get<std::string>(); }
  bool moments(size_t i) const { return e_[i]["moments"].get<bool>(); }
  SliceOf slice(size_t i) const {
    if (!e_[i].contains("slice")) return {};
    try {
      return slice_from_json(e_[i]["slice"]);
    } catch (const std::exception& x) {
      throw std::runtime_error(fmt::format("checkpoint {}: {}: {}", root_.string(), name(i), x.what()));
    }
  }
  // Part `part` (0 values, 1 and 2 the moments) of entry i: its end - begin floats.
  torch::Tensor part(size_t i, int part) {
    const std::vector<float>& f = floats(i);
    const int64_t n = e_[i]["end"].get<int64_t>() - e_[i]["begin"].get<int64_t>();
    return torch::from_blob(const_cast<float*>(f.data()) + part * n, {n}, torch::kFloat);
  }
  void forget() { cache_.clear(); }

 private:
  fs::path root_;
  const json& e_;
  std::map<size_t, std::vector<float>> cache_;  // entry -> its floats (values, then moments), checked

  const std::vector<float>& floats(size_t i) {
    if (auto it = cache_.find(i); it != cache_.end()) return it->second;
    const json& e = e_[i];
    const int64_t n = e["end"].get<int64_t>() - e["begin"].get<int64_t>();
    const size_t count = static_cast<size_t>(n) * (moments(i) ? 3 : 1);
    std::vector<float> buf(count);
    const fs::path file = root_ / e["file"].get<std::string>();
    std::ifstream in(file, std::ios::binary);
    in.seekg(e["offset"].get<std::streamoff>());
    in.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(count * sizeof(float)));
    if (!in)
      throw std::runtime_error(fmt::format("checkpoint {}: {} is missing or truncated (reading {})", root_.string(),
                                           file.filename().string(), name(i)));
    if (fmt::format("{:016x}", fnv1a(reinterpret_cast<const char*>(buf.data()), count * sizeof(float))) != e["hash"])
      throw std::runtime_error(fmt::format("checkpoint {}: {} is corrupt: {} elements [{}, {}) fail their checksum", root_.string(),
                                           file.filename().string(), name(i), e["begin"].get<int64_t>(), e["end"].get<int64_t>()));
    return cache_[i] = std::move(buf);
  }
};

void need_moments(const std::string& path, const StatePiece& p, Entries& es, size_t i) {
  if (p.exp_avg.defined() && !es.moments(i))
    throw std::runtime_error(fmt::format("checkpoint {}: saved without optimizer moments (SGD); this run's AdamW needs them", path));
}

[[noreturn]] void incomplete(const std::string& path, const StatePiece& p, int64_t from) {
  throw std::runtime_error(fmt::format("checkpoint {}: parameter {}.{} elements [{}, {}) are in no file (incomplete checkpoint)", path,
                                       p.region, p.param, from, p.end));
}

// Piece p from entries that are element ranges of what p is a range of: copied range by range.
// Returns how far from p.begin the entries reached (p.end: all of it).
int64_t fill_ranges(const std::string& path, StatePiece& p, Entries& es, std::vector<size_t> order) {
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return es[a]["begin"] < es[b]["begin"]; });
  int64_t covered = p.begin;
  for (size_t i : order) {
    const int64_t b0 = es[i]["begin"], b1 = es[i]["end"], a = std::max(covered, b0), b = std::min(p.end, b1);
    if (a >= b || a != covered) continue;
    need_moments(path, p, es, i);
    p.value.narrow(0, a - p.begin, b - a).copy_(es.part(i, 0).narrow(0, a - b0, b - a));
    if (p.exp_avg.defined()) {
      p.exp_avg.narrow(0, a - p.begin, b - a).copy_(es.part(i, 1).narrow(0, a - b0, b - a));
      p.exp_avg_sq.narrow(0, a - p.begin, b - a).copy_(es.part(i, 2).narrow(0, a - b0, b - a));
    }
    covered = b;
  }
  return covered;
}

// Piece p where the checkpoint or this plan cuts the parameter into tensor-parallel slices (and not
// the same way): the whole parameter (values, moments) rebuilt from the entries — each slice once all
// its ranges are read — and p's elements taken from it.
void fill_through_whole(const std::string& path, StatePiece& p, Entries& es, const std::vector<size_t>& order) {
  std::vector<int64_t> shape = p.slice.shape;
  for (size_t i : order)
    if (const SliceOf s = es.slice(i); s.sliced()) shape = s.shape;
  const int parts = p.exp_avg.defined() ? 3 : 1;
  std::vector<torch::Tensor> whole;
  for (int k = 0; k < parts; ++k) whole.push_back(torch::zeros({p.numel}, torch::kFloat));
  torch::Tensor have = torch::zeros({p.numel}, torch::kBool);
  std::map<int64_t, std::pair<SliceOf, std::vector<size_t>>> slices;  // coord -> its entries
  for (size_t i : order) {
    const SliceOf s = es.slice(i);
    if (s.sliced()) {
      if (s.shape != shape) throw std::runtime_error(fmt::format("checkpoint {}: {} is saved with two shapes", path, es.name(i)));
      auto& [slice, list] = slices[s.coord];
      slice = s;
      list.push_back(i);
      continue;
    }
    need_moments(path, p, es, i);
    const int64_t b0 = es[i]["begin"], n = es[i]["end"].get<int64_t>() - b0;
    for (int k = 0; k < parts; ++k) whole[size_t(k)].narrow(0, b0, n).copy_(es.part(i, k));
    have.narrow(0, b0, n).fill_(true);
  }
  for (auto& [coord, sl] : slices) {
    const auto& [slice, list] = sl;
    StatePiece one;  // the slice, whole
    one.region = p.region, one.param = p.param, one.numel = p.numel, one.end = p.numel / slice.ways;
    for (int k = 0; k < parts; ++k) (k == 0 ? one.value : k == 1 ? one.exp_avg : one.exp_avg_sq) = torch::empty({one.end});
    if (fill_ranges(path, one, es, list) < one.end) continue;  // not saved whole: missing below, if p needs it
    const torch::Tensor got[3] = {one.value, one.exp_avg, one.exp_avg_sq};
    for (int k = 0; k < parts; ++k) place_slice(whole[size_t(k)], got[k], slice);
    place_slice(have, torch::ones({one.end}, torch::kBool), slice);
  }
  auto mine = [&](const torch::Tensor& t) { return take_slice(t.view(shape), p.slice).view({-1}).narrow(0, p.begin, p.end - p.begin); };
  const torch::Tensor missing = mine(have).logical_not().nonzero();
  if (missing.numel() > 0) incomplete(path, p, p.begin + missing[0].item<int64_t>());
  p.value.copy_(mine(whole[0]));
  if (parts == 3) {
    p.exp_avg.copy_(mine(whole[1]));
    p.exp_avg_sq.copy_(mine(whole[2]));
  }
}
}  // namespace

json read_checkpoint(const std::string& path, std::vector<StatePiece>& want,
                     const std::set<std::pair<std::string, std::string>>& model_params) {
  const json m = read_manifest(fs::path(path));
  std::map<std::pair<std::string, std::string>, std::vector<size_t>> by_param;
  const json& entries = m["entries"];
  for (size_t i = 0; i < entries.size(); ++i) by_param[{entries[i]["region"], entries[i]["param"]}].push_back(i);
  for (const auto& [key, list] : by_param)
    if (!model_params.count(key))
      throw std::runtime_error(fmt::format("checkpoint {}: has parameter {}.{}, which this model does not (saved from another "
                                           "model?)",
                                           path, key.first, key.second));
  for (const auto& key : model_params)
    if (!by_param.count(key))
      throw std::runtime_error(fmt::format("checkpoint {}: has no parameter {}.{} (saved from another model?)", path, key.first,
                                           key.second));
  Entries es(path, entries);
  torch::NoGradGuard no_grad;
  for (StatePiece& p : want) {
    const std::string name = p.region + "." + p.param;
    auto it = by_param.find({p.region, p.param});
    if (it == by_param.end())
      throw std::runtime_error(fmt::format("checkpoint {}: has no parameter {} (saved from another model?)", path, name));
    bool same_cut = true;  // every entry cut as p is (a whole parameter, or the same slice)
    for (size_t i : it->second) {
      if (entries[i]["numel"].get<int64_t>() != p.numel)
        throw std::runtime_error(fmt::format("checkpoint {}: parameter {} has {} elements there, {} in this model", path, name,
                                             entries[i]["numel"].get<int64_t>(), p.numel));
      same_cut = same_cut && es.slice(i) == p.slice;
    }
    if (same_cut) {
      if (const int64_t covered = fill_ranges(path, p, es, it->second); covered < p.end) incomplete(path, p, covered);
    } else {
      fill_through_whole(path, p, es, it->second);
    }
  }
  return m;
}

}  // namespace piper::runtime
