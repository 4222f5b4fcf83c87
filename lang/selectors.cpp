// Region selectors (`layers[0..3].moe.experts`) resolved against the manifest, with suggestions.
#include "lang/checker_impl.h"

namespace piper::check {

std::vector<std::string> Checker::child_names(RegionId r) const {
  std::vector<std::string> out;
  for (RegionId c : m_.regions[r].children) out.push_back(m_.regions[c].leaf);
  return out;
}

// A path below `from` to a descendant named `leaf`, in selector syntax (`moe.experts`).
std::optional<std::string> Checker::find_below(RegionId from, const std::string& leaf) const {
  std::vector<std::pair<RegionId, std::string>> queue{{from, ""}};
  for (size_t q = 0; q < queue.size() && q < 10000; ++q) {
    auto [r, path] = queue[q];
    for (RegionId c : m_.regions[r].children) {
      const std::string& l = m_.regions[c].leaf;
      bool numeric = !l.empty() && std::isdigit(static_cast<unsigned char>(l[0]));
      if (numeric && c != m_.regions[r].children.front()) continue;  // one list member is enough
      std::string p = numeric ? path + "[*]" : path + (path.empty() ? "" : ".") + l;
      if (l == leaf) return p;
      queue.emplace_back(c, p);
    }
  }
  return std::nullopt;
}

std::optional<std::vector<RegionId>> Checker::resolve(const ast::Selector& sel, const Env& env) {
  if (sel.whole_model) return std::vector<RegionId>{0};
  std::vector<RegionId> cur{0};
  std::string so_far;
  for (const ast::SelectorPart& part : sel.parts) {
    std::vector<RegionId> next;
    for (RegionId r : cur) {
      auto c = m_.child(r, part.name);
      if (!c) {
        SourceLoc at = part.loc;
        at.length = static_cast<uint32_t>(part.name.size());
        std::string hint = did_you_mean(part.name, child_names(r));
        if (hint.empty())
          if (auto below = find_below(r, part.name))
            hint = fmt::format("; did you mean '{}{}{}'?", so_far,
                               so_far.empty() || below->front() == '[' ? "" : ".", *below);
        auto& d = diags_.error(at, r == 0 ? fmt::format("unknown region '{}'{}", part.name, hint)
                                          : fmt::format("'{}' has no region '{}'{}", m_.selector_text(r),
                                                        part.name, hint));
        if (hint.empty() && !m_.regions[r].children.empty()) {
          auto names = child_names(r);
          if (m_.is_list(r)) d.note(SourceLoc{}, fmt::format("'{}' is a list of {}: index it, e.g. {}[0]",
                                                              m_.selector_text(r), names.size(), part.name));
          else d.note(SourceLoc{}, fmt::format("regions here: {}", fmt::join(names, ", ")));
        }
        return std::nullopt;
      }
      next.push_back(*c);
    }
    so_far += (so_far.empty() ? "" : ".") + part.name;
    if (part.index != ast::SelectorPart::Index::None) {
      std::vector<RegionId> indexed;
      for (RegionId r : next) {
        if (!m_.is_list(r)) {
          diags_.error(part.loc, fmt::format("'{}' is not a list and cannot be indexed", m_.selector_text(r)));
          return std::nullopt;
        }
        const auto& ch = m_.regions[r].children;
        int64_t n = static_cast<int64_t>(ch.size());
        if (part.index == ast::SelectorPart::Index::All) {
          indexed.insert(indexed.end(), ch.begin(), ch.end());
          continue;
        }
        auto lo = eval_int(*part.lo, env, "an index");
        if (!lo) return std::nullopt;
        int64_t hi = *lo;
        if (part.index == ast::SelectorPart::Index::Range) {
          auto h = eval_int(*part.hi, env, "an index");
          if (!h) return std::nullopt;
          hi = *h;
          if (hi < *lo) {
            diags_.error(part.loc, fmt::format("empty range {}..{} (ranges include both ends)", *lo, hi));
            return std::nullopt;
          }
        }
        for (int64_t idx : {*lo, hi}) {
          if (idx < 0 || idx >= n) {
            diags_.error(part.loc, fmt::format("index {} is out of range: '{}' has {} entries (0..{})", idx,
                                               m_.selector_text(r), n, n - 1));
            return std::nullopt;
          }
        }
        for (int64_t i = *lo; i <= hi; ++i) indexed.push_back(ch[static_cast<size_t>(i)]);
      }
      next = std::move(indexed);
      so_far += part.index == ast::SelectorPart::Index::All ? "[*]" : "[..]";
    }
    cur = std::move(next);
  }
  return cur;
}

std::optional<std::vector<RegionId>> Checker::resolve_all(const std::vector<ast::Selector>& sels, const Env& env) {
  std::vector<RegionId> out;
  for (const auto& s : sels) {
    auto r = resolve(s, env);
    if (!r) return std::nullopt;
    for (RegionId id : *r)
      if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  }
  return out;
}

// Pipeline regions (sequence members) covered by a selection, in sequence order.
std::optional<std::vector<RegionId>> Checker::to_pipeline(const std::vector<RegionId>& sel, const ast::Selector& where) {
  std::vector<RegionId> out;
  for (RegionId seq : m_.sequence) {
    bool hit = false;
    for (RegionId r : sel) {
      if (m_.is_ancestor(r, seq)) hit = true;
      else if (m_.is_ancestor(seq, r) && r != seq) {
        diags_.error(where.loc, fmt::format("cannot place '{}' by itself: only the pipeline's regions are placed, "
                                            "and '{}' moves with '{}'",
                                            m_.selector_text(r), m_.selector_text(r), m_.selector_text(seq)));
        return std::nullopt;
      }
    }
    if (hit) out.push_back(seq);
  }
  return out;
}

}  // namespace piper::check
