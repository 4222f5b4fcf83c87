#include "runtime/experts.h"

#include <torch/torch.h>

#include "runtime/memory_counter.h"
#include "runtime/rank_view.h"

namespace piper::runtime {

namespace {
std::vector<size_t> equal_split(size_t ways, int64_t per) {
  std::vector<size_t> off;
  for (size_t k = 0; k <= ways; ++k) off.push_back(k * static_cast<size_t>(per));
  return off;
}
}  // namespace

void ExpertExchange::dispatch(const PieceIO& router, PieceIO& expert) {
  MemScope scope(MemCategory::Activations);
  const torch::Tensor &h = router.outputs.at(1), &g = router.outputs.at(2);
  auto hg = torch::cat({h, g}, -1).detach().contiguous();
  const int64_t ways = static_cast<int64_t>(group.size());
  torch::Tensor all = torch::empty({ways * hg.size(0), hg.size(1), hg.size(2)});
  comm.all_gather(hg.data_ptr<float>(), all.data_ptr<float>(), equal_split(group.size(), hg.numel()), group, kExpertChannel);
  const int64_t dm = h.size(-1);
  expert.inputs = {all.slice(-1, 0, dm).contiguous().requires_grad_(true),
                   all.slice(-1, dm, all.size(-1)).contiguous().requires_grad_(true)};
}

torch::Tensor ExpertExchange::combine(const PieceIO& router, const PieceIO& expert) {
  MemScope scope(MemCategory::Activations);
  auto part = expert.outputs.at(0).detach().contiguous();
  const int64_t ways = static_cast<int64_t>(group.size());
  torch::Tensor y = torch::empty({part.size(0) / ways, part.size(1), part.size(2)});
  comm.reduce_scatter_sum(part.data_ptr<float>(), y.data_ptr<float>(), equal_split(group.size(), y.numel()), group,
                          kExpertChannel);
  return router.outputs.at(0).detach() + y;
}

torch::Tensor ExpertExchange::combine_transpose(const torch::Tensor& grad_out, PieceIO& router) {
  MemScope scope(MemCategory::Activations);
  torch::Tensor gx = grad_out.contiguous();
  router.grad_residual = gx;
  const int64_t ways = static_cast<int64_t>(group.size());
  torch::Tensor all = torch::empty({ways * gx.size(0), gx.size(1), gx.size(2)});
  comm.all_gather(gx.data_ptr<float>(), all.data_ptr<float>(), equal_split(group.size(), gx.numel()), group, kExpertChannel);
  return all;
}

std::vector<torch::Tensor> ExpertExchange::dispatch_transpose(const std::vector<torch::Tensor>& grad_inputs) {
  MemScope scope(MemCategory::Activations);
  auto ghg = torch::cat({grad_inputs.at(0), grad_inputs.at(1)}, -1).contiguous();
  const int64_t ways = static_cast<int64_t>(group.size());
  torch::Tensor out = torch::empty({ghg.size(0) / ways, ghg.size(1), ghg.size(2)});
  comm.reduce_scatter_sum(ghg.data_ptr<float>(), out.data_ptr<float>(), equal_split(group.size(), out.numel()), group,
                          kExpertChannel);
  const int64_t dm = ghg.size(-1) - grad_inputs.at(1).size(-1);
  return {out.slice(-1, 0, dm), out.slice(-1, dm, out.size(-1))};
}

}  // namespace piper::runtime
