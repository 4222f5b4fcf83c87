// The static deadlock check: every rank's stream programs run against each other with blocking
// send/recv rendezvous and cross-stream events; what cannot finish is drawn as torch pipelining's
// rank × step grid with `<-- ERROR HERE`, and the cycle of waits named.
#include <fmt/format.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ir/emit.h"
#include "scheduler/schedule.h"

namespace piper::sched {

using ir::Node;
using ir::NodeId;
using ir::Op;

namespace {
class ProgramWalk {
 public:
  ProgramWalk(const ir::Graph& g, const Schedule& s) : g_(g), s_(s), adj_(g.adjacency()) {
    const size_t n = g.nodes.size();
    stream_of_.assign(n, -1);
    done_.assign(n, false);
    for (size_t c = 0; c < s.classes.size(); ++c)
      for (const auto& p : s.classes[c].streams) {
        for (NodeId v : p.ops) stream_of_[at(v)] = static_cast<int32_t>(streams_.size());
        streams_.push_back(Stream{static_cast<int32_t>(c), &p});
      }
    collective_.assign(n, -1);
    collectives_ = cross_class_collectives(g);
    for (size_t k = 0; k < collectives_.size(); ++k)
      for (NodeId m : collectives_[k]) collective_[at(m)] = static_cast<int32_t>(k);
  }

  // Runs every stream's head while it is not blocked; true when every op ran.
  bool completes() {
    size_t finished = 0;
    for (bool progress = true; progress;) {
      progress = false;
      for (auto& st : streams_)
        for (; st.head < st.prog->ops.size() && !blocker(st.prog->ops[st.head]); ++st.head) {
          done_[at(st.prog->ops[st.head])] = true;
          ++finished;
          progress = true;
        }
    }
    return finished == g_.nodes.size();
  }

  // After completes() failed: the grid, each stream up to its stuck head, and the cycle of waits.
  std::string describe() {
    std::string out = "the per-rank programs deadlock (blocking send/recv and events):\n";
    for (size_t i = 0; i < streams_.size(); ++i) {
      const Stream& st = streams_[i];
      out += fmt::format("  {:<24}", name(static_cast<int32_t>(i)) + ":");
      for (size_t k = 0; k < st.prog->ops.size(); ++k) {
        out += " " + ir::token(g_.nodes[at(st.prog->ops[k])]);
        if (k == st.head) {
          out += "  <-- ERROR HERE";
          break;
        }
      }
      out += "\n";
    }
    return out + cycle();
  }

 private:
  struct Stream {  // a (class, stream) running its ops in order; head: the op it is at
    int32_t cls;
    const StreamProgram* prog;
    size_t head = 0;
  };
  static size_t at(NodeId v) { return static_cast<size_t>(v); }

  bool at_head(NodeId v) const {
    const Stream& st = streams_[static_cast<size_t>(stream_of_[at(v)])];
    return st.head < st.prog->ops.size() && st.prog->ops[st.head] == v;
  }

  // A send's receive, or a receive's send (-1: none).
  NodeId partner(NodeId v) const {
    if (g_.nodes[at(v)].op == Op::Recv)
      for (int32_t k = adj_.in_offsets[at(v)]; k < adj_.in_offsets[at(v) + 1]; ++k) {
        NodeId u = g_.edges[static_cast<size_t>(adj_.in_edges[static_cast<size_t>(k)])].src;
        if (g_.nodes[at(u)].op == Op::Send) return u;
      }
    for (int32_t k = adj_.out_offsets[at(v)]; k < adj_.out_offsets[at(v) + 1]; ++k) {
      NodeId w = g_.edges[static_cast<size_t>(adj_.out_edges[static_cast<size_t>(k)])].dst;
      if (g_.nodes[at(w)].op == Op::Recv) return w;
    }
    return -1;
  }

  // What a head op is blocked on: a predecessor not done yet, an op it is issued after, or its
  // rendezvous partner (a send's receive; a collective's other classes' members) not posted.
  std::optional<NodeId> blocker(NodeId v) const {
    const Node& x = g_.nodes[at(v)];
    for (int32_t k = adj_.in_offsets[at(v)]; k < adj_.in_offsets[at(v) + 1]; ++k) {
      NodeId u = g_.edges[static_cast<size_t>(adj_.in_edges[static_cast<size_t>(k)])].src;
      if (x.op == Op::Recv && g_.nodes[at(u)].op == Op::Send) continue;  // the rendezvous, below
      if (!done_[at(u)]) return u;
    }
    if (at(v) < s_.issue_after.size())
      for (NodeId u : s_.issue_after[at(v)])
        if (!done_[at(u)]) return u;
    if (x.op == Op::Send || x.op == Op::Recv) {
      NodeId p = partner(v);
      if (p >= 0 && !done_[at(p)] && !at_head(p)) return p;
    }
    if (int32_t k = collective_[at(v)]; k >= 0)  // one collective over classes: all must have reached it
      for (NodeId p : collectives_[static_cast<size_t>(k)])
        if (!done_[at(p)] && !at_head(p)) return p;
    return std::nullopt;
  }

  std::string name(int32_t si) const {
    const Stream& st = streams_[static_cast<size_t>(si)];
    return fmt::format("rank {} {}", ir::rank_list(s_.classes[static_cast<size_t>(st.cls)].ranks), g_.streams[st.prog->stream]);
  }

  // Follows "blocked by" from one stuck stream until a stream repeats: that is the cycle of waits.
  std::string cycle() const {
    std::map<int32_t, size_t> seen;
    int32_t cur = -1;
    for (size_t i = 0; i < streams_.size() && cur < 0; ++i)
      if (streams_[i].head < streams_[i].prog->ops.size()) cur = static_cast<int32_t>(i);
    std::vector<int32_t> path;
    while (cur >= 0 && !seen.count(cur)) {
      seen[cur] = path.size();
      path.push_back(cur);
      const Stream& st = streams_[static_cast<size_t>(cur)];
      auto b = blocker(st.prog->ops[st.head]);
      cur = b ? stream_of_[at(*b)] : -1;
    }
    if (cur < 0) return "";
    std::string out = "  cycle of waits:";
    for (size_t i = seen[cur]; i < path.size(); ++i) {
      const Stream& st = streams_[static_cast<size_t>(path[i])];
      out += fmt::format(" {} [{}] ->", name(path[i]), ir::token(g_.nodes[at(st.prog->ops[st.head])]));
    }
    return out + fmt::format(" {}\n", name(cur));
  }

  const ir::Graph& g_;
  const Schedule& s_;
  const ir::Graph::Adjacency adj_;
  std::vector<Stream> streams_;
  std::vector<int32_t> stream_of_;
  std::vector<bool> done_;
  std::vector<std::vector<NodeId>> collectives_;  // cross_class_collectives
  std::vector<int32_t> collective_;               // per node: its set there, or -1
};
}  // namespace

std::optional<std::string> find_deadlock(const ir::Graph& g, const Schedule& s) {
  ProgramWalk walk(g, s);
  if (walk.completes()) return std::nullopt;
  return walk.describe();
}

}  // namespace piper::sched
