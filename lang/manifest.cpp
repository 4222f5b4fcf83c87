#include "lang/manifest.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <charconv>
#include <map>
#include <nlohmann/json.hpp>

namespace piper {

using nlohmann::json;

namespace {
constexpr std::pair<const char*, DType> kDTypes[] = {
    {"float32", DType::F32}, {"float16", DType::F16}, {"bfloat16", DType::BF16},
    {"int64", DType::I64},   {"int32", DType::I32},   {"uint8", DType::U8}};

bool is_number(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

class Loader {
 public:
  Loader(FileId f, const SourceManager& src, DiagnosticEngine& d) : file_(f), sources_(src), diags_(d) {}

  std::optional<Manifest> load() {
    json j;
    try {
      j = json::parse(sources_.text(file_));
    } catch (const json::parse_error& e) {
      // nlohmann reports "[json.exception.parse_error.101] parse error at line 3, column 7: ..."
      std::string what = e.what();
      size_t colon = what.find(": ", what.find("parse error"));
      diags_.error(sources_.loc_at(file_, e.byte > 0 ? e.byte - 1 : 0),
                   "manifest is not valid JSON: " + (colon == std::string::npos ? what : what.substr(colon + 2)));
      return std::nullopt;
    }
    if (!j.is_object()) return fail("", "a manifest is a JSON object");
    Manifest m;
    if (j.value("format", "") != "piper-manifest")
      return fail("format", "missing \"format\": \"piper-manifest\" (is this a Piper region manifest?)");
    if (!j.contains("version") || !j["version"].is_number_integer())
      return fail("version", "missing integer \"version\"");
    m.version = j["version"].get<int>();
    if (m.version != Manifest::kVersion)
      return fail("version", fmt::format("manifest version {} is not supported; this Piper reads version {}",
                                         m.version, Manifest::kVersion));
    if (j.contains("model") && j["model"].is_object()) m.model_name = j["model"].value("name", "");
    Region root;  // the whole model: an implicit group above every region
    root.kind = "model";
    root.implicit = true;
    m.regions.push_back(std::move(root));

    if (!j.contains("regions") || !j["regions"].is_array() || j["regions"].empty())
      return fail("regions", "missing non-empty array \"regions\"");
    const json& regions = j["regions"];
    for (size_t i = 0; i < regions.size(); ++i)
      if (!region(m, regions[i], fmt::format("regions[{}]", i))) return std::nullopt;
    link(m);

    if (!j.contains("sequence") || !j["sequence"].is_array() || j["sequence"].empty())
      return fail("sequence", "missing non-empty array \"sequence\" (the top-level regions a pipeline cuts)");
    for (size_t i = 0; i < j["sequence"].size(); ++i) {
      std::string path = fmt::format("sequence[{}]", i);
      const json& s = j["sequence"][i];
      if (!s.is_string()) return fail(path, "expected a region name");
      auto id = m.find(s.get<std::string>());
      if (!id) return fail(path, fmt::format("'{}' is not a region of this manifest", s.get<std::string>()));
      for (RegionId other : m.sequence)
        if (m.is_ancestor(other, *id) || m.is_ancestor(*id, other))
          return fail(path, fmt::format("'{}' overlaps '{}', which is already in the sequence",
                                        m.regions[*id].name, m.regions[other].name));
      m.sequence.push_back(*id);
    }
    // Every region with parameters must belong to the pipeline, or no placement could hold it.
    for (RegionId r = 1; r < RegionId(m.regions.size()); ++r) {
      if (m.regions[r].params.empty()) continue;
      bool covered = std::any_of(m.sequence.begin(), m.sequence.end(),
                                 [&](RegionId s) { return m.is_ancestor(s, r) || m.is_ancestor(r, s); });
      if (!covered)
        return fail("sequence", fmt::format("region '{}' has parameters but is not in (or under) the sequence",
                                            m.regions[r].name));
    }
    if (j.contains("ties") && !ties(m, j["ties"])) return std::nullopt;
    return m;
  }

 private:
  // "ties": [[{"region": "embed", "param": "wte"}, {"region": "head", "param": "lm_head_weight"}], ...]
  bool ties(Manifest& m, const json& j) {
    if (!j.is_array()) return fail("ties", "expected an array of ties (each an array of {\"region\", \"param\"})"), false;
    for (size_t t = 0; t < j.size(); ++t) {
      const std::string at = fmt::format("ties[{}]", t);
      if (!j[t].is_array() || j[t].size() < 2)
        return fail(at, "a tie lists at least two {\"region\": ..., \"param\": ...} members"), false;
      Tie tie;
      for (size_t k = 0; k < j[t].size(); ++k) {
        const json& e = j[t][k];
        const std::string where = fmt::format("{}[{}]", at, k);
        if (!e.is_object() || !e.contains("region") || !e["region"].is_string() || !e.contains("param") ||
            !e["param"].is_string())
          return fail(where, "expected {\"region\": name, \"param\": name}"), false;
        const std::string rname = e["region"], pname = e["param"];
        auto r = m.find(rname);
        if (!r || *r == 0) return fail(where, fmt::format("'{}' is not a region of this manifest", rname)), false;
        const auto& params = m.regions[static_cast<size_t>(*r)].params;
        auto it = std::find_if(params.begin(), params.end(), [&](const ParamSpec& p) { return p.name == pname; });
        if (it == params.end())
          return fail(where, fmt::format("region '{}' lists no parameter '{}'", rname, pname)), false;
        // A tie is one whole tensor in every region that holds it; a tensor-parallel slice of it would
        // be summed with whole copies (a vocabulary-parallel tie is not built yet).
        if (it->sharded())
          return fail(where, fmt::format("{}.{} says how it shards over tensor parallelism (\"shard\"): a tied "
                                         "parameter cannot be sharded", rname, pname)), false;
        TiedParam member{*r, static_cast<int32_t>(it - params.begin())};
        if (m.tie_of(member.region, member.index) >= 0 ||
            std::find(tie.members.begin(), tie.members.end(), member) != tie.members.end())
          return fail(where, fmt::format("{}.{} is already tied", rname, pname)), false;
        if (std::any_of(tie.members.begin(), tie.members.end(), [&](const TiedParam& o) { return o.region == *r; }))
          return fail(where, fmt::format("two members of one tie in region '{}'; a tie joins different regions", rname)),
                 false;
        if (!tie.members.empty()) {
          const TiedParam& first = tie.members.front();
          const ParamSpec& a = m.regions[static_cast<size_t>(first.region)].params[static_cast<size_t>(first.index)];
          if (a.shape != it->shape || a.dtype != it->dtype)
            return fail(where, fmt::format("{}.{} is {}{}, but {}.{} is {}{}: tied parameters are one tensor", rname,
                                           pname, dtype_name(it->dtype), json(it->shape).dump(),
                                           m.regions[static_cast<size_t>(first.region)].name, a.name,
                                           dtype_name(a.dtype), json(a.shape).dump())),
                   false;
        }
        tie.members.push_back(member);
      }
      m.ties.push_back(std::move(tie));
    }
    return true;
  }

  std::nullopt_t fail(const std::string& path, const std::string& msg) {
    std::string where = path.empty() ? "" : fmt::format("at {}: ", path);
    diags_.error(SourceLoc{file_, 0, 0, 0}, fmt::format("invalid manifest: {}{}", where, msg));
    return std::nullopt;
  }

  std::optional<std::vector<int64_t>> shape(const json& j, const std::string& path) {
    if (!j.is_array()) return fail(path, "a shape is an array of non-negative integers"), std::nullopt;
    std::vector<int64_t> out;
    for (const json& d : j) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        return fail(path, "a shape is an array of non-negative integers"), std::nullopt;
      out.push_back(d.get<int64_t>());
    }
    return out;
  }

  std::optional<DType> dtype(const json& j, const std::string& path) {
    if (j.is_string())
      if (auto t = dtype_from_name(j.get<std::string>())) return t;
    fail(path, "dtype must be one of float32, float16, bfloat16, int64, int32, uint8");
    return std::nullopt;
  }

  std::optional<TensorSpec> tensor(const json& j, const std::string& path) {
    if (!j.is_object()) return fail(path, "expected {\"shape\": [...], \"dtype\": ...}"), std::nullopt;
    auto s = shape(j.value("shape", json()), path + ".shape");
    if (!s) return std::nullopt;
    auto t = dtype(j.value("dtype", json("float32")), path + ".dtype");
    if (!t) return std::nullopt;
    return TensorSpec{*s, *t};
  }

  bool region(Manifest& m, const json& j, const std::string& path) {
    if (!j.is_object()) return fail(path, "a region is a JSON object"), false;
    if (!j.contains("name") || !j["name"].is_string() || j["name"].get<std::string>().empty())
      return fail(path + ".name", "missing region name"), false;
    Region r;
    r.name = j["name"].get<std::string>();
    std::string where = fmt::format("{} ('{}')", path, r.name);
    for (std::string_view part : split(r.name))
      if (part.empty()) return fail(where, "region names are dot-separated, without empty parts"), false;
    if (auto it = index_.find(r.name); it != index_.end() && !m.regions[it->second].implicit)
      return fail(where, "region is listed twice"), false;
    r.kind = j.value("kind", "region");
    if (j.contains("flops")) {
      if (!j["flops"].is_number() || j["flops"].get<double>() < 0)
        return fail(where + ".flops", "flops must be a non-negative number"), false;
      r.flops = static_cast<int64_t>(j["flops"].get<double>());
    }
    for (auto [field, slot] : {std::pair{"memory", &r.memory}, std::pair{"memory_bf16", &r.memory_bf16},
                               std::pair{"memory_tp2", &r.memory_tp2}, std::pair{"memory_cp2", &r.memory_cp2}}) {
      if (!j.contains(field)) continue;
      const json& mem = j[field];
      RegionMemory rm;
      Measured held, peak;
      for (auto [key, out] : {std::pair{"saved", &rm.saved}, std::pair{"forward_peak", &rm.forward_peak},
                              std::pair{"backward_peak", &rm.backward_peak}, std::pair{"split_held", &held},
                              std::pair{"split_peak", &peak}}) {
        const std::string at = fmt::format("{}.{}.{}", where, field, key);
        const json* v = mem.is_object() && mem.contains(key) ? &mem[key] : nullptr;
        const bool optional = out == &held || out == &peak;
        if (!v && optional) continue;
        if (!v || !v->is_array() || v->size() != 3 ||
            std::any_of(v->begin(), v->end(), [](const json& x) { return !x.is_number_integer() || x.get<int64_t>() < 0; }))
          return fail(at, "expected [bytes at 1, 2 and 4 samples] (non-negative integers)"), false;
        *out = Measured{(*v)[0].get<int64_t>(), (*v)[1].get<int64_t>(), (*v)[2].get<int64_t>()};
        if (out == &held) rm.split_held = held;
        if (out == &peak) rm.split_peak = peak;
      }
      *slot = rm;
    }
    for (const char* key : {"input", "output"}) {
      if (!j.contains(key)) continue;
      auto t = tensor(j[key], where + "." + key);
      if (!t) return false;
      (std::string_view(key) == "input" ? r.input : r.output) = t;
    }
    if (j.contains("params")) {
      if (!j["params"].is_array()) return fail(where + ".params", "expected an array"), false;
      for (size_t i = 0; i < j["params"].size(); ++i) {
        const json& p = j["params"][i];
        std::string pp = fmt::format("{}.params[{}]", where, i);
        if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
          return fail(pp, "a parameter needs a name, shape and dtype"), false;
        ParamSpec spec;
        spec.name = p["name"].get<std::string>();
        auto s = shape(p.value("shape", json()), pp + ".shape");
        if (!s) return false;
        auto t = dtype(p.value("dtype", json("float32")), pp + ".dtype");
        if (!t) return false;
        spec.shape = *s;
        spec.dtype = *t;
        int64_t n = 1;
        for (int64_t d : spec.shape)
          if (__builtin_mul_overflow(n, d, &n)) return fail(pp + ".shape", "shape is too large"), false;
        if (__builtin_mul_overflow(n, dtype_bytes(spec.dtype), &spec.bytes))
          return fail(pp + ".shape", "shape is too large"), false;
        if (p.contains("bytes") && (!p["bytes"].is_number_integer() || p["bytes"].get<int64_t>() != spec.bytes))
          return fail(pp + ".bytes", fmt::format("says {} but shape and dtype give {} bytes", p["bytes"].dump(),
                                                 spec.bytes)), false;
        if (p.contains("shard") && !param_shard(p["shard"], pp + ".shard", spec)) return false;
        r.params.push_back(std::move(spec));
      }
    }
    if (j.contains("tp") && !tensor_layout(j["tp"], where + ".tp", r)) return false;
    if (j.contains("work") && !work(j["work"], where + ".work", j.contains("flops"), r)) return false;
    if (j.contains("cp")) {
      if (!j["cp"].is_string() || (j["cp"] != "tokenwise" && j["cp"] != "attention"))
        return fail(where + ".cp", "expected \"tokenwise\" or \"attention\" (how the region runs on a share of the tokens)"), false;
      r.cp = j["cp"].get<std::string>();
    }
    if (!r.tp && std::any_of(r.params.begin(), r.params.end(), [](const ParamSpec& p) { return p.sharded(); }))
      return fail(where, "parameters say how they shard, but the region has no \"tp\" layout"), false;
    insert(m, std::move(r));
    return true;
  }

  // `"shard": {"dim": 0, "blocks": 3}`: which dimension tensor parallelism cuts (ParamSpec).
  bool param_shard(const json& j, const std::string& at, ParamSpec& spec) {
    const int64_t rank = static_cast<int64_t>(spec.shape.size());
    if (!j.is_object() || !j.contains("dim") || !j["dim"].is_number_integer() || j["dim"].get<int64_t>() < 0 ||
        j["dim"].get<int64_t>() >= rank)
      return fail(at, fmt::format("expected {{\"dim\": 0..{}, \"blocks\": n}} (the dimension tensor parallelism cuts)",
                                  rank - 1)), false;
    spec.shard_dim = static_cast<int32_t>(j["dim"].get<int64_t>());
    spec.shard_blocks = 1;
    if (j.contains("blocks")) {
      if (!j["blocks"].is_number_integer() || j["blocks"].get<int64_t>() < 1)
        return fail(at + ".blocks", "expected a positive integer"), false;
      spec.shard_blocks = j["blocks"].get<int64_t>();
    }
    if (spec.shape[static_cast<size_t>(spec.shard_dim)] % spec.shard_blocks != 0)
      return fail(at, fmt::format("dimension {} ({}) does not split into {} blocks", spec.shard_dim,
                                  spec.shape[static_cast<size_t>(spec.shard_dim)], spec.shard_blocks)), false;
    return true;
  }

  // `"work": [{"op": "gemm", "m": 512, "n": 1536, "k": 512, "shard": "n"}, {"op": "attention", ...},
  // {"op": "memory", "elements": 1024}]`: what the region's forward is made of (Work).
  bool work(const json& j, const std::string& at, bool has_flops, Region& r) {
    if (!j.is_array()) return fail(at, "expected an array of {\"op\": \"gemm\"|\"attention\"|\"memory\", ...}"), false;
    double total = 0;
    for (size_t i = 0; i < j.size(); ++i) {
      const json& w = j[i];
      const std::string wi = fmt::format("{}[{}]", at, i);
      auto count = [&](const char* key, int64_t& out) {
        if (!w.contains(key) || !w[key].is_number_integer() || w[key].get<int64_t>() < 1)
          return fail(wi, fmt::format("\"{}\" must be a positive integer", key)), false;
        out = w[key].get<int64_t>();
        return true;
      };
      Work x;
      const std::string op = w.is_object() ? w.value("op", "") : "";
      if (op == "gemm") {
        x.kind = Work::Kind::Gemm;
        if (!count("m", x.m) || !count("n", x.n) || !count("k", x.k)) return false;
      } else if (op == "attention") {
        x.kind = Work::Kind::Attention;
        if (!count("heads", x.heads) || !count("head_dim", x.head_dim) || !count("q", x.q) || !count("kv", x.kv)) return false;
        x.v_dim = x.head_dim;
        if (w.contains("v_dim") && !count("v_dim", x.v_dim)) return false;
        x.causal = w.value("causal", false);
      } else if (op == "memory") {
        x.kind = Work::Kind::Memory;
        if (!count("elements", x.elements)) return false;
      } else {
        return fail(wi, "expected {\"op\": \"gemm\"|\"attention\"|\"memory\", ...}"), false;
      }
      // Attention's heads always divide over tp; a product or memory work only where it says how.
      const std::string sh = w.is_object() ? w.value("shard", "") : "";
      if (x.kind != Work::Kind::Attention && sh != "" && sh != "n" && sh != (x.kind == Work::Kind::Gemm ? "k" : "n"))
        return fail(wi + ".shard", x.kind == Work::Kind::Gemm ? "expected \"n\" (column-parallel) or \"k\" (row-parallel)"
                                                              : "expected \"n\" (the elements divide over tp)"), false;
      x.shard = x.kind == Work::Kind::Attention ? 'n' : sh.empty() ? 0 : sh[0];
      total += x.flops();
      r.work.push_back(x);
    }
    const double stated = static_cast<double>(r.flops);
    if (!has_flops) r.flops = static_cast<int64_t>(total);
    else if (std::abs(stated - total) > 1e-6 * std::max(stated, total))
      return fail(at, fmt::format("adds up to {:.0f} FLOPs per sample, but the region's \"flops\" says {:.0f}", total, stated)), false;
    return true;
  }

  // `"tp": {"dim": "heads", "count": 12}`: the region can be sharded over a tensor-parallel axis.
  bool tensor_layout(const json& j, const std::string& at, Region& r) {
    if (!j.is_object() || !j.contains("dim") || !j["dim"].is_string() || !j.contains("count") ||
        !j["count"].is_number_integer() || j["count"].get<int64_t>() < 1)
      return fail(at, "expected {\"dim\": \"heads\", \"count\": n} (what tensor parallelism splits, how many)"), false;
    r.tp = TensorLayout{j["dim"].get<std::string>(), j["count"].get<int64_t>()};
    for (const ParamSpec& p : r.params)
      if (p.sharded() && (p.shape[static_cast<size_t>(p.shard_dim)] / p.shard_blocks) % r.tp->count != 0)
        return fail(at, fmt::format("parameter '{}' dimension {} ({} in {} blocks) is not a multiple of {} {}", p.name,
                                    p.shard_dim, p.shape[static_cast<size_t>(p.shard_dim)], p.shard_blocks,
                                    r.tp->count, r.tp->dim)), false;
    return true;
  }

  static std::vector<std::string_view> split(std::string_view name) {
    std::vector<std::string_view> out;
    size_t start = 0;
    while (true) {
      size_t dot = name.find('.', start);
      out.push_back(name.substr(start, dot - start));
      if (dot == std::string_view::npos) break;
      start = dot + 1;
    }
    return out;
  }

  // Adds a region and any implicit ancestors (e.g. `layers` for `layers.0`).
  void insert(Manifest& m, Region r) {
    auto parts = split(r.name);
    RegionId parent = 0;
    std::string prefix;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      prefix += (i ? "." : "") + std::string(parts[i]);
      std::optional<RegionId> found;
      if (auto it = index_.find(prefix); it != index_.end()) found = it->second;
      if (!found) {
        Region g;
        g.name = prefix;
        g.leaf = std::string(parts[i]);
        g.kind = "group";
        g.implicit = true;
        g.parent = parent;
        m.regions.push_back(std::move(g));
        index_[prefix] = RegionId(m.regions.size() - 1);
        found = RegionId(m.regions.size() - 1);
      }
      parent = *found;
    }
    r.leaf = std::string(parts.back());
    r.parent = parent;
    // A region listed after an implicit placeholder for it replaces the placeholder.
    if (auto existing = index_.find(r.name); existing != index_.end()) {
      r.children = m.regions[existing->second].children;
      m.regions[existing->second] = std::move(r);
      return;
    }
    m.regions.push_back(std::move(r));
    index_[m.regions.back().name] = RegionId(m.regions.size() - 1);
  }

  // Children in a stable order: numeric names by value, others in listing order.
  void link(Manifest& m) {
    for (auto& r : m.regions) r.children.clear();
    for (RegionId id = 1; id < RegionId(m.regions.size()); ++id) m.regions[m.regions[id].parent].children.push_back(id);
    for (auto& r : m.regions) {
      std::stable_sort(r.children.begin(), r.children.end(), [&](RegionId a, RegionId b) {
        const std::string &la = m.regions[a].leaf, &lb = m.regions[b].leaf;
        if (is_number(la) && is_number(lb)) return std::stoll(la) < std::stoll(lb);
        return false;
      });
    }
  }

  FileId file_;
  const SourceManager& sources_;
  DiagnosticEngine& diags_;
  std::map<std::string, RegionId> index_;
};
}  // namespace

double Work::flops() const {
  switch (kind) {
    case Kind::Gemm: return 2.0 * double(m) * double(n) * double(k);
    case Kind::Attention: {
      const double all = 2.0 * double(q) * double(kv) * double(heads) * double(head_dim + v_dim);
      return causal ? all / 2 : all;
    }
    case Kind::Memory: return 0;
  }
  return 0;
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (auto [n, t] : kDTypes)
    if (name == n) return t;
  return std::nullopt;
}
const char* dtype_name(DType t) {
  for (auto [n, d] : kDTypes)
    if (d == t) return n;
  return "?";
}
int64_t dtype_bytes(DType t) {
  switch (t) {
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: return 2;
    case DType::I64: return 8;
    case DType::U8: return 1;
  }
  return 0;
}

std::optional<RegionId> Manifest::find(std::string_view dotted) const {
  if (dotted.empty()) return 0;
  RegionId cur = 0;
  size_t start = 0;
  while (true) {
    size_t dot = dotted.find('.', start);
    auto next = child(cur, dotted.substr(start, dot - start));
    if (!next) return std::nullopt;
    cur = *next;
    if (dot == std::string_view::npos) return cur;
    start = dot + 1;
  }
}

std::optional<RegionId> Manifest::child(RegionId parent, std::string_view leaf) const {
  if (parent < 0 || parent >= RegionId(regions.size())) return std::nullopt;
  for (RegionId c : regions[parent].children)
    if (regions[c].leaf == leaf) return c;
  return std::nullopt;
}

bool Manifest::is_list(RegionId r) const {
  const auto& ch = regions[r].children;
  if (ch.empty()) return false;
  for (size_t i = 0; i < ch.size(); ++i)
    if (regions[ch[i]].leaf != std::to_string(i)) return false;
  return true;
}

int64_t Manifest::param_bytes(RegionId r) const {
  int64_t total = 0;
  for (const auto& p : regions[r].params) total += p.bytes;
  for (RegionId c : regions[r].children) total += param_bytes(c);
  return total;
}

int32_t Manifest::tie_of(RegionId r, int32_t index) const {
  for (size_t t = 0; t < ties.size(); ++t)
    for (const TiedParam& p : ties[t].members)
      if (p.region == r && p.index == index) return static_cast<int32_t>(t);
  return -1;
}

int64_t Manifest::unique(const std::vector<RegionId>& rs, bool bytes) const {
  int64_t total = 0;
  for (RegionId r : rs) total += bytes ? param_bytes(r) : param_count(r);
  for (const Tie& t : ties) {  // every member under rs after the first one is a duplicate
    bool seen = false;
    for (const TiedParam& p : t.members) {
      if (std::none_of(rs.begin(), rs.end(), [&](RegionId r) { return is_ancestor(r, p.region); })) continue;
      const ParamSpec& spec = regions[static_cast<size_t>(p.region)].params[static_cast<size_t>(p.index)];
      if (seen) total -= bytes ? spec.bytes : spec.bytes / dtype_bytes(spec.dtype);
      seen = true;
    }
  }
  return total;
}

int64_t Manifest::param_count(RegionId r) const {
  int64_t total = 0;
  for (const auto& p : regions[r].params) total += p.bytes / dtype_bytes(p.dtype);
  for (RegionId c : regions[r].children) total += param_count(c);
  return total;
}

int64_t Manifest::flops(RegionId r) const {
  int64_t total = regions[r].flops;
  for (RegionId c : regions[r].children) total += flops(c);
  return total;
}

bool Manifest::is_ancestor(RegionId a, RegionId b) const {
  for (RegionId cur = b; cur >= 0; cur = regions[cur].parent)
    if (cur == a) return true;
  return false;
}

std::string Manifest::selector_text(RegionId r) const {
  if (r == 0) return "*";
  std::vector<RegionId> chain;
  for (RegionId cur = r; cur > 0; cur = regions[cur].parent) chain.push_back(cur);
  std::string out;
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    const std::string& leaf = regions[*it].leaf;
    if (is_number(leaf)) out += "[" + leaf + "]";
    else out += (out.empty() ? "" : ".") + leaf;
  }
  return out;
}

std::optional<Manifest> parse_manifest(FileId file, const SourceManager& sources, DiagnosticEngine& diags) {
  return Loader(file, sources, diags).load();
}

}  // namespace piper
