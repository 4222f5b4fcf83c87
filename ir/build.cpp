// Pass 1, build: the single-device DAG — per stage a forward chunk, a backward chunk and an update,
// chained through the stages (forward down, loss at the end, backward up).
#include <fmt/format.h>

#include "ir/pass.h"

namespace piper::ir {

namespace {
// Sharded list regions named by any shard directive, so build can cut stages around them.
std::vector<RegionId> sharded_lists(const CheckedStrategy& s) {
  std::vector<RegionId> out;
  for (const auto& d : s.directives)
    if (const auto* sh = std::get_if<ShardDirective>(&d.body)) out.insert(out.end(), sh->regions.begin(), sh->regions.end());
  return out;
}

// A stage's pieces: dense runs and, for each sharded list inside it, an expert piece of its own
// (the all-to-alls of the shard pass go between them).
std::vector<Segment> cut(const Stage& stage, const Manifest& m, const std::vector<RegionId>& sharded) {
  std::vector<Segment> out(1);
  for (RegionId r : stage.regions) {
    std::vector<RegionId> inside;
    for (RegionId l : sharded)
      if (m.is_ancestor(r, l)) inside.push_back(l);
    Segment& dense = out.back();
    dense.regions.push_back(r);
    dense.param_bytes += m.param_bytes(r);
    dense.flops += m.flops(r);
    for (RegionId l : inside) {
      out.back().param_bytes -= m.param_bytes(l);
      out.back().flops -= m.flops(l);
      Segment expert;
      expert.sharded = l;
      expert.param_bytes = m.param_bytes(l);
      expert.flops = m.flops(l);
      out.push_back(std::move(expert));
      out.emplace_back();  // what follows the experts: the rest of the layer and the next ones
    }
  }
  if (out.size() > 1 && out.back().regions.empty()) out.pop_back();  // stage ends with experts
  return out;
}
}  // namespace

int64_t LowerContext::activation_bytes(const std::optional<TensorSpec>& t) const {
  if (!t) return 0;
  int64_t n = dtype_bytes(t->dtype) * options.samples_per_microbatch;
  for (int64_t d : t->shape) n *= d;
  return n;
}

void build_pass(LowerContext& c) {
  Graph& g = c.graph;
  const auto& stages = c.strategy.stages;
  auto sharded = sharded_lists(c.strategy);
  c.segments.clear();
  for (const Stage& st : stages) c.segments.push_back(cut(st, c.manifest, sharded));

  int32_t act = g.tensor("activation"), grad = g.tensor("activation_grad"), saved = g.tensor("saved_activations");
  int32_t pgrad = g.tensor("param_grads"), loss = g.tensor("loss_grad");
  NodeId prev_f = -1;  // last forward piece so far, down the pipeline
  std::vector<NodeId> first_b(stages.size());
  for (size_t s = 0; s < stages.size(); ++s) {
    const auto& segs = c.segments[s];
    int64_t boundary = c.activation_bytes(c.manifest.regions[stages[s].regions.front()].input);
    NodeId update = g.add(Node{Op::U, Payload::None, 0, 0, -1, int32_t(s), -1, 0, -1, -1, -1, -1, 0});
    std::vector<NodeId> f(segs.size()), b(segs.size());
    for (size_t j = 0; j < segs.size(); ++j) {
      int16_t seg = segs.size() > 1 ? int16_t(j) : int16_t(-1);
      f[j] = g.add(Node{Op::F, Payload::None, 0, 0, seg, int32_t(s), 0, 0, -1, -1, -1, -1, segs[j].param_bytes, segs[j].flops});
      b[j] = g.add(Node{Op::B, Payload::None, 0, 0, seg, int32_t(s), 0, 0, -1, -1, -1, -1, segs[j].param_bytes, segs[j].flops});
      g.connect(f[j], b[j], EdgeKind::Data, 0, saved);  // the backward needs the forward's activations
      g.connect(b[j], update, EdgeKind::Data, segs[j].param_bytes, pgrad);
      if (j > 0) {
        g.connect(f[j - 1], f[j], EdgeKind::Data, boundary, act);
        g.connect(b[j], b[j - 1], EdgeKind::Data, boundary, grad);
      }
    }
    if (prev_f >= 0) {
      g.connect(prev_f, f.front(), EdgeKind::Data, boundary, act);
      g.connect(b.front(), first_b[s - 1], EdgeKind::Data, boundary, grad);
    }
    prev_f = f.back();
    first_b[s] = b.back();  // the backward enters a stage at its last piece
  }
  // The loss: the last stage's forward output turns into the first backward's input on the spot.
  NodeId last_b = first_b.back();
  g.connect(prev_f, last_b, EdgeKind::Data, 0, loss);
}

}  // namespace piper::ir
