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
constexpr int kVersion = 1;

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

json read_checkpoint(const std::string& path, std::vector<StatePiece>& want,
                     const std::set<std::pair<std::string, std::string>>& model_params) {
  const fs::path root(path);
  json m;
  {
    std::ifstream in(root / "manifest.json");
    if (!in) throw std::runtime_error(fmt::format("checkpoint {}: cannot open manifest.json", path));
    m = json::parse(in, nullptr, false);
  }
  if (m.is_discarded() || !m.is_object() || m.value("format", "") != "piper-checkpoint" || !m.contains("entries"))
    throw std::runtime_error(fmt::format("checkpoint {}: manifest.json is not a Piper checkpoint manifest (corrupt?)", path));
  if (m.value("version", 0) != kVersion)
    throw std::runtime_error(fmt::format("checkpoint {}: format version {}, this piper-run reads {}", path, m.value("version", 0), kVersion));
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
  std::map<size_t, std::vector<float>> cache;  // entry -> its floats (values, then moments), checked
  auto floats_of = [&](size_t i) -> const std::vector<float>& {
    if (auto it = cache.find(i); it != cache.end()) return it->second;
    const json& e = entries[i];
    const int64_t n = e["end"].get<int64_t>() - e["begin"].get<int64_t>();
    const size_t count = static_cast<size_t>(n) * (e["moments"].get<bool>() ? 3 : 1);
    std::vector<float> buf(count);
    const fs::path file = root / e["file"].get<std::string>();
    std::ifstream in(file, std::ios::binary);
    in.seekg(e["offset"].get<std::streamoff>());
    in.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(count * sizeof(float)));
    if (!in)
      throw std::runtime_error(fmt::format("checkpoint {}: {} is missing or truncated (reading {}.{})", path, file.filename().string(),
                                           e["region"].get<std::string>(), e["param"].get<std::string>()));
    if (fmt::format("{:016x}", fnv1a(reinterpret_cast<const char*>(buf.data()), count * sizeof(float))) != e["hash"])
      throw std::runtime_error(fmt::format("checkpoint {}: {} is corrupt: {}.{} elements [{}, {}) fail their checksum", path,
                                           file.filename().string(), e["region"].get<std::string>(), e["param"].get<std::string>(),
                                           e["begin"].get<int64_t>(), e["end"].get<int64_t>()));
    return cache[i] = std::move(buf);
  };
  torch::NoGradGuard no_grad;
  for (StatePiece& p : want) {
    const std::string name = p.region + "." + p.param;
    auto it = by_param.find({p.region, p.param});
    if (it == by_param.end())
      throw std::runtime_error(fmt::format("checkpoint {}: has no parameter {} (saved from another model?)", path, name));
    int64_t covered = p.begin;
    std::vector<size_t> order = it->second;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return entries[a]["begin"] < entries[b]["begin"]; });
    for (size_t i : order) {
      const json& e = entries[i];
      if (e["numel"].get<int64_t>() != p.numel)
        throw std::runtime_error(fmt::format("checkpoint {}: parameter {} has {} elements there, {} in this model", path, name,
                                             e["numel"].get<int64_t>(), p.numel));
      const int64_t b0 = e["begin"], b1 = e["end"], a = std::max(covered, b0), b = std::min(p.end, b1);
      if (a >= b || a != covered) continue;
      if (p.exp_avg.defined() && !e["moments"].get<bool>())
        throw std::runtime_error(fmt::format("checkpoint {}: saved without optimizer moments (SGD); this run's AdamW needs them",
                                             path));
      const std::vector<float>& f = floats_of(i);
      const int64_t len = b - a, n = b1 - b0;
      auto src = [&](int64_t part) {
        return torch::from_blob(const_cast<float*>(f.data()) + part * n + (a - b0), {len}, torch::kFloat);
      };
      p.value.narrow(0, a - p.begin, len).copy_(src(0));
      if (p.exp_avg.defined()) {
        p.exp_avg.narrow(0, a - p.begin, len).copy_(src(1));
        p.exp_avg_sq.narrow(0, a - p.begin, len).copy_(src(2));
      }
      covered = b;
    }
    if (covered < p.end)
      throw std::runtime_error(fmt::format("checkpoint {}: parameter {} elements [{}, {}) are in no file (incomplete checkpoint)",
                                           path, name, covered, p.end));
  }
  return m;
}

}  // namespace piper::runtime
