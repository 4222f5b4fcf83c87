#include "runtime/model/backward_split.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "runtime/device/torch_compat.h"

namespace piper::runtime {

using torch::autograd::Edge;
using torch::autograd::Node;

// How it works. Call I the nodes of the graph that lie on a path from an output to an input: the
// input half. A node of I may also have edges leaving I toward parameters (a linear's weight, a layer
// norm's scale): call those nodes branch points. Every path from an output to a parameter leaves I
// for the last time at some branch point (or never enters I), so the weight gradients are exactly
// what flows out of the branch points along their edges that leave I, given the gradients the branch
// points received. Hence:
//   BI runs the engine on I alone (outputs: the inputs and the branch points' inputs, so nothing
//      else runs, and the branch points compute only the gradients I needs) and captures what each
//      branch point received;
//   every other node of I lets go of what it saved as soon as it has run (BW never runs it): the
//      cut alone would free little, since a branch point's saved input (a linear's X) holds its
//      grad_fn and through it the chain of I back to the branch point before, with all those nodes
//      saved (a GELU's input, attention's probabilities); and freed as they run, BI's peak is not
//      every saved tensor and every captured gradient at once;
//   then the branch points' edges into I are cut: the rest of I goes with the outputs;
//   BW runs the engine from the branch points with what they received: only the edges that leave I
//      remain, so only weight gradients are computed.
namespace {
struct Marks {
  bool input = false;  // reaches an input
  bool param = false;  // reaches a parameter (a leaf that is not an input)
};

// Marks every node reachable from `roots`, children first (an explicit stack: graphs of deep
// models are long chains).
std::unordered_map<Node*, Marks> mark(const std::vector<Edge>& roots, const std::unordered_set<Node*>& inputs) {
  std::unordered_map<Node*, Marks> marks;
  std::vector<std::pair<Node*, bool>> stack;  // (node, children done)
  for (const Edge& r : roots)
    if (r.is_valid()) stack.emplace_back(r.function.get(), false);
  while (!stack.empty()) {
    auto [n, expanded] = stack.back();
    stack.pop_back();
    if (!expanded) {
      if (marks.count(n)) continue;
      marks[n];  // visiting
      stack.emplace_back(n, true);
      for (const Edge& e : n->next_edges())
        if (e.is_valid() && !marks.count(e.function.get())) stack.emplace_back(e.function.get(), false);
      continue;
    }
    Marks m;
    if (inputs.count(n)) m.input = true;
    else if (n->next_edges().empty()) m.param = true;
    for (const Edge& e : n->next_edges()) {
      if (!e.is_valid()) continue;
      const Marks& c = marks[e.function.get()];
      m.input |= c.input;
      m.param |= c.param;
    }
    marks[n] = m;
  }
  return marks;
}

// PIPER_SPLIT_KEEP_SAVED=1: the input half keeps what it saved until BW, as the split did before
// 2026-12-07 (a measuring switch: bench/split_memory_bench.sh runs both ways).
bool release_as_run() {
  static const bool keep = [] {
    const char* v = std::getenv("PIPER_SPLIT_KEEP_SAVED");
    return v && std::string(v) == "1";
  }();
  return !keep;
}

// Frees its node's saved tensors once the node has run (under keep_graph the engine keeps them).
struct ReleaseWhenRun : torch::autograd::FunctionPostHook {
  explicit ReleaseWhenRun(Node* n) : node(n) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grad_inputs,
                                            const torch::autograd::variable_list&) override {
    node->release_variables();
    return grad_inputs;
  }
  Node* node;  // the hook's owner
};
}  // namespace

std::vector<torch::Tensor> backward_inputs(const std::vector<torch::Tensor>& outputs, const std::vector<torch::Tensor>& grads,
                                           const std::vector<torch::Tensor>& inputs, WeightHalf* rest) {
  std::vector<Edge> roots;
  std::vector<torch::Tensor> root_grads;
  for (size_t i = 0; i < outputs.size(); ++i) {
    roots.push_back(torch::autograd::impl::gradient_edge(outputs[i]));
    root_grads.push_back(i < grads.size() && grads[i].defined() ? grads[i] : torch::ones_like(outputs[i]));
  }
  std::vector<Edge> input_edges;
  std::unordered_set<Node*> input_nodes;
  for (const auto& x : inputs) {
    input_edges.push_back(torch::autograd::impl::gradient_edge(x));
    input_nodes.insert(input_edges.back().function.get());
  }
  const auto marks = mark(roots, input_nodes);

  // The branch points, and the edges into them whose gradients BI captures.
  std::vector<AutogradNodePtr> branches;
  std::unordered_set<Node*> seen;
  auto visit = [&](const AutogradNodePtr& n) { return seen.insert(n.get()).second; };
  std::vector<AutogradNodePtr> todo;
  for (const Edge& r : roots)
    if (r.is_valid() && marks.at(r.function.get()).input && visit(r.function)) todo.push_back(r.function);
  while (!todo.empty()) {
    AutogradNodePtr n = std::move(todo.back());
    todo.pop_back();
    bool branch = false;
    for (const Edge& e : n->next_edges()) {
      if (!e.is_valid()) continue;
      const Marks& c = marks.at(e.function.get());
      if (c.input) {
        if (visit(e.function)) todo.push_back(e.function);
      } else if (c.param) {
        branch = true;
      }
    }
    if (branch) branches.push_back(n);
    else if (release_as_run()) n->add_post_hook(std::make_unique<ReleaseWhenRun>(n.get()));
  }
  std::vector<Edge> outputs_wanted = input_edges;
  for (const auto& b : branches)
    for (uint32_t k = 0; k < b->num_inputs(); ++k) outputs_wanted.emplace_back(b, k);

  auto& engine = torch::autograd::Engine::get_default_engine();
  std::vector<torch::Tensor> got;
  if (!branches.empty() || !inputs.empty())
    got = engine.execute(roots, root_grads, /*keep_graph=*/true, /*create_graph=*/false, /*accumulate_grad=*/false,
                         outputs_wanted);

  rest->roots.clear();
  rest->grads.clear();
  // Outputs that do not reach an input: their whole backward is weight gradients.
  for (size_t i = 0; i < roots.size(); ++i)
    if (roots[i].is_valid() && !marks.at(roots[i].function.get()).input) {
      rest->roots.push_back(roots[i]);
      rest->grads.push_back(root_grads[i]);
    }
  size_t at = inputs.size();
  for (const auto& b : branches)
    for (uint32_t k = 0; k < b->num_inputs(); ++k, ++at)
      if (got.at(at).defined()) {
        rest->roots.emplace_back(b, k);
        rest->grads.push_back(got[at]);
      }
  // Cut the branch points' edges into I: the rest of I and what it saved is freed once the outputs
  // are. (next_edges() is written directly: set_next_edge insists on an unparented node, which
  // guards the topological order of edges added, not removed.)
  for (const auto& b : branches)
    for (Edge& e : b->next_edges())
      if (e.is_valid() && marks.at(e.function.get()).input) e = Edge();
  got.resize(inputs.size());
  return got;
}

void backward_weights(WeightHalf& rest) {
  if (!rest.roots.empty())
    torch::autograd::Engine::get_default_engine().execute(rest.roots, rest.grads, /*keep_graph=*/false,
                                                          /*create_graph=*/false, /*accumulate_grad=*/true, {});
  rest.roots.clear();
  rest.grads.clear();
}

}  // namespace piper::runtime
