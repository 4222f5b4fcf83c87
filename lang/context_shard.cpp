// The checker's `shard SEL over AXIS sequence ring;`: context parallelism over a model axis, the
// regions run on shares of each sample's tokens as the manifest's `cp` layouts allow.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "lang/checker_impl.h"

namespace piper::check {

// The regions with a `cp` layout that `r` is made of, in order: itself, or all its children's
// (a block of attention and MLP); false when some part has none.
bool Checker::context_leaves(RegionId r, std::vector<RegionId>& out) const {
  const Region& reg = m_.regions[static_cast<size_t>(r)];
  if (!reg.cp.empty()) {
    out.push_back(r);
    return true;
  }
  if (reg.children.empty()) return false;
  for (RegionId c : reg.children)
    if (!context_leaves(c, out)) return false;
  return true;
}

void Checker::context_shard(const ast::ShardStmt& sh, const ast::Stmt& s, const std::vector<RegionId>& sel,
                            const std::string& axis) {
  const SourceLoc at = sh.regions.front().loc;
  if (sh.exchange->first != "ring") {
    diags_.error(sh.exchange->second, fmt::format("unknown context-parallel exchange '{}'", sh.exchange->first))
        .note(SourceLoc{}, "known: ring (keys and values passed round the axis; the all-to-all variant is not built yet)");
    return;
  }
  if (sh.dim) {
    diags_.error(sh.dim->second, "context parallelism splits the sequence, not the region's tensors")
        .note(SourceLoc{}, fmt::format("write `shard ... over {} sequence ring;`", axis));
    return;
  }
  if (sh.stream) {
    diags_.error(sh.stream->loc, "a context shard's exchanges run inside its regions, on their compute stream")
        .note(SourceLoc{}, "drop `on stream`: naming a stream for them is not supported yet");
    return;
  }
  const int64_t n = axis_size(axis);
  std::vector<RegionId> leaves;
  for (RegionId r : sel) {
    const Region& reg = m_.regions[static_cast<size_t>(r)];
    if (!context_leaves(r, leaves)) {
      std::vector<std::string> with;
      for (size_t q = 0; q < m_.regions.size() && with.size() < 3; ++q)
        if (!m_.regions[q].cp.empty()) with.push_back(fmt::format("{} ({})", m_.selector_text(RegionId(q)), m_.regions[q].kind));
      auto& d = diags_.error(at, fmt::format("cannot shard '{}' over {} by the sequence: it has no context-parallel "
                                             "layout in the manifest", m_.selector_text(r), axis));
      if (with.empty()) d.note(SourceLoc{}, "the manifest declares none (a region's `cp` field, docs/manifest.md)");
      else d.note(SourceLoc{}, fmt::format("regions with one: {}{}", fmt::join(with, ", "), with.size() == 3 ? ", ..." : ""));
      return;
    }
    // Load balancing cuts each sample's tokens into 2·cp chunks (activations lead with the sequence).
    if (const auto& in = reg.input; in && !in->shape.empty() && in->shape[0] % (2 * n) != 0) {
      diags_.error(sh.exchange->second, fmt::format("'{}' has a sequence of {}, which does not divide into 2×{}={} "
                                                    "chunks for load-balanced ring attention",
                                                    m_.selector_text(r), in->shape[0], axis, 2 * n));
      return;
    }
  }
  for (RegionId r : leaves) {
    if (auto [it, fresh] = context_sharded_.emplace(r, s.loc); !fresh) {
      diags_.error(at, fmt::format("'{}' is split by the sequence twice", m_.selector_text(r))).note(it->second, "first here");
      return;
    }
  }
  if (!claim_model_axis(context_axes_, axis, sh.axis.loc, s.loc, "one context-parallel axis per strategy: regions are "
                                                                  "already split over '{}'", "split over it here"))
    return;
  out_.directives.push_back(Directive{s.loc, ContextShardDirective{sel, leaves, axis, sh.exchange->first}, diags_.context()});
}

}  // namespace piper::check
