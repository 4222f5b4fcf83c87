#include "runtime/exec/experts.h"

#include <torch/torch.h>

#include "runtime/device/memory_counter.h"

namespace piper::runtime {

namespace {
constexpr size_t kFloat = sizeof(float);

// Member k's experts as column indices of the gates.
torch::Tensor owned_by(const StageView::Experts& ex, size_t k, torch::Device on) {
  return torch::tensor(ex.shard->owned(static_cast<int64_t>(k)), torch::TensorOptions(torch::kLong).device(on));
}

// Sends parts[k] (rows of floats) to member k; returns what each member sent here, rows of `width`,
// `rows_from[k]` of them from member k, one after another in group order.
torch::Tensor exchange(Communicator& comm, const std::vector<int>& group, int channel, const std::vector<torch::Tensor>& parts,
                       const std::vector<int64_t>& rows_from, int64_t width) {
  std::vector<size_t> send_bytes, recv_bytes;
  std::vector<torch::Tensor> flat;
  for (const auto& p : parts) {
    flat.push_back(p.contiguous().view({-1}));
    send_bytes.push_back(static_cast<size_t>(p.numel()) * kFloat);
  }
  int64_t rows = 0;
  for (int64_t n : rows_from) {
    recv_bytes.push_back(static_cast<size_t>(n * width) * kFloat);
    rows += n;
  }
  torch::Tensor send = torch::cat(flat);
  torch::Tensor recv = torch::empty({rows, width}, send.options());
  comm.all_to_all_v(send.data_ptr(), send_bytes, recv.data_ptr(), recv_bytes, group, channel);
  return recv;
}
}  // namespace

void ExpertExchange::dispatch(const PieceIO& router, PieceIO& expert) {
  MemScope scope(MemCategory::Activations);
  const torch::Tensor h = router.outputs.at(1).detach(), g = router.outputs.at(2).detach();
  const int64_t d = h.size(-1), experts = g.size(-1);
  const torch::Tensor hf = h.reshape({-1, d}), gf = g.reshape({-1, experts});
  const size_t ways = ex.group.size();
  std::vector<torch::Tensor> parts;
  std::vector<int64_t> count_to(ways), count_from(ways);
  expert.route_to.clear();
  for (size_t k = 0; k < ways; ++k) {
    const torch::Tensor gk = gf.index_select(1, owned_by(ex, k, gf.device()));
    const torch::Tensor idx = (gk != 0).any(1).nonzero().squeeze(1);  // tokens that chose one of k's experts
    expert.route_to.push_back(idx);
    parts.push_back(torch::cat({hf.index_select(0, idx), gk.index_select(0, idx)}, 1));
    count_to[k] = idx.size(0);
  }
  // Counts first: each member learns how many tokens it gets from each.
  const std::vector<size_t> one(ways, sizeof(int64_t));
  comm.all_to_all_v(count_to.data(), one, count_from.data(), one, ex.group, channel);
  expert.route_from = count_from;
  const int64_t mine = static_cast<int64_t>(ex.owned.size());
  torch::Tensor got = exchange(comm, ex.group, channel, parts, count_from, d + mine);
  expert.inputs = {got.slice(1, 0, d).contiguous().requires_grad_(true),
                   got.slice(1, d, d + mine).contiguous().requires_grad_(true)};
}

torch::Tensor ExpertExchange::combine(const PieceIO& router, const PieceIO& expert) {
  MemScope scope(MemCategory::Activations);
  const torch::Tensor part = expert.outputs.at(0).detach();
  const torch::Tensor& a = router.outputs.at(0);
  const int64_t d = a.size(-1);
  std::vector<torch::Tensor> back;
  std::vector<int64_t> rows_from;
  for (size_t k = 0, at = 0; k < ex.group.size(); ++k) {
    const int64_t n = expert.route_from[k];
    back.push_back(part.slice(0, static_cast<int64_t>(at), static_cast<int64_t>(at) + n));
    at += static_cast<size_t>(n);
    rows_from.push_back(expert.route_to[k].size(0));
  }
  const torch::Tensor got = exchange(comm, ex.group, channel, back, rows_from, d);
  torch::Tensor y = torch::zeros({a.numel() / d, d}, a.options());
  for (size_t k = 0, at = 0; k < ex.group.size(); ++k) {
    const int64_t n = rows_from[k];
    y.index_add_(0, expert.route_to[k], got.slice(0, static_cast<int64_t>(at), static_cast<int64_t>(at) + n));
    at += static_cast<size_t>(n);
  }
  return a.detach() + y.view_as(a);
}

torch::Tensor ExpertExchange::combine_transpose(const torch::Tensor& grad_out, PieceIO& router, const PieceIO& expert) {
  MemScope scope(MemCategory::Activations);
  const torch::Tensor gx = grad_out.contiguous();
  router.grad_residual = gx;
  const int64_t d = gx.size(-1);
  const torch::Tensor gf = gx.view({-1, d});
  std::vector<torch::Tensor> parts;
  for (const auto& idx : expert.route_to) parts.push_back(gf.index_select(0, idx));
  return exchange(comm, ex.group, channel, parts, expert.route_from, d);
}

std::vector<torch::Tensor> ExpertExchange::dispatch_transpose(const std::vector<torch::Tensor>& grad_inputs,
                                                              const PieceIO& router, const PieceIO& expert) {
  MemScope scope(MemCategory::Activations);
  const torch::Tensor& h = router.outputs.at(1);
  const torch::Tensor& g = router.outputs.at(2);
  const int64_t d = h.size(-1), experts = g.size(-1), mine = static_cast<int64_t>(ex.owned.size());
  int64_t received = 0;
  for (int64_t n : expert.route_from) received += n;
  // An expert piece that got no tokens has no gradient: zeros.
  const torch::Tensor gh = grad_inputs.size() > 0 && grad_inputs[0].defined() ? grad_inputs[0] : torch::zeros({received, d}, h.options());
  const torch::Tensor gg = grad_inputs.size() > 1 && grad_inputs[1].defined() ? grad_inputs[1] : torch::zeros({received, mine}, g.options());
  const torch::Tensor rows = torch::cat({gh, gg}, 1);
  std::vector<torch::Tensor> back;
  for (size_t k = 0, at = 0; k < ex.group.size(); ++k) {
    const int64_t n = expert.route_from[k];
    back.push_back(rows.slice(0, static_cast<int64_t>(at), static_cast<int64_t>(at) + n));
    at += static_cast<size_t>(n);
  }
  // Member k sends d + |k's experts| floats per token this rank routed to it.
  std::vector<size_t> send_bytes, recv_bytes;
  std::vector<torch::Tensor> flat;
  for (const auto& p : back) {
    flat.push_back(p.contiguous().view({-1}));
    send_bytes.push_back(static_cast<size_t>(p.numel()) * kFloat);
  }
  std::vector<torch::Tensor> cols;
  int64_t total = 0;
  for (size_t k = 0; k < ex.group.size(); ++k) {
    cols.push_back(owned_by(ex, k, g.device()));
    const int64_t width = d + cols.back().size(0);
    recv_bytes.push_back(static_cast<size_t>(expert.route_to[k].size(0) * width) * kFloat);
    total += expert.route_to[k].size(0) * width;
  }
  const torch::Tensor send = torch::cat(flat);
  torch::Tensor recv = torch::empty({total}, send.options());
  comm.all_to_all_v(send.data_ptr(), send_bytes, recv.data_ptr(), recv_bytes, ex.group, channel);
  torch::Tensor out_h = torch::zeros({h.numel() / d, d}, h.options()), out_g = torch::zeros({g.numel() / experts, experts}, g.options());
  int64_t at = 0;
  for (size_t k = 0; k < ex.group.size(); ++k) {
    const torch::Tensor& idx = expert.route_to[k];
    const int64_t n = idx.size(0), width = d + cols[k].size(0);
    const torch::Tensor part = recv.slice(0, at, at + n * width).view({n, width});
    at += n * width;
    out_h.index_add_(0, idx, part.slice(1, 0, d));
    out_g.index_put_({idx.unsqueeze(1), cols[k].unsqueeze(0)}, part.slice(1, d, width), /*accumulate=*/true);
  }
  return {out_h.view(h.sizes()), out_g.view(g.sizes())};
}

}  // namespace piper::runtime
