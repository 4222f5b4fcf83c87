#include "runtime/profile/profiler.h"

#include <fmt/format.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <nlohmann/json.hpp>

#include "runtime/exec/chunk_runner.h"
#include "runtime/exec/executor.h"
#include "runtime/model/region_model.h"
#include "runtime/model/region_model_impl.h"
#include "runtime/exec/stage_params.h"
#include "runtime/profile/handoffs.h"
#include "lang/frontend.h"

namespace piper::runtime {

namespace {
using nlohmann::json;
constexpr int kChannel = 7;  // the profiler's own sequence of collectives
constexpr int kTag = 1 << 29;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Least squares through (x, y): fixed + per * x, neither negative (noise can tilt a line fitted to
// a near-proportional cost below the origin; then the line through the origin).
std::pair<double, double> fit(const std::vector<double>& x, const std::vector<double>& y) {
  const double n = static_cast<double>(x.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sx += x[i];
    sy += y[i];
    sxx += x[i] * x[i];
    sxy += x[i] * y[i];
  }
  const double d = n * sxx - sx * sx;
  if (d <= 0) return {sy / n, 0};
  const double per = (n * sxy - sx * sy) / d, fixed = (sy - per * sx) / n;
  if (fixed < 0) return {0, sxx > 0 ? std::max(0.0, sxy / sxx) : 0};
  if (per < 0) return {std::max(0.0, sy / n), 0};
  return {fixed, per};
}

json line(std::pair<double, double> a) { return json::array({a.first, a.second}); }

// The forward FLOPs per sample of each sequence region's subtree (the manifest's facts).
std::vector<double> sequence_flops(const json& manifest, const std::vector<std::string>& sequence) {
  std::vector<double> out;
  for (const auto& name : sequence) {
    double f = 0;
    for (const auto& r : manifest["regions"]) {
      const std::string rn = r.value("name", "");
      if (rn == name || rn.starts_with(name + ".")) f += r.value("flops", 0.0);
    }
    out.push_back(f);
  }
  return out;
}

class Group {
 public:
  explicit Group(Communicator& c) : comm_(c) {
    for (int r = 0; r < c.size(); ++r) everyone_.push_back(r);
    comm_.prepare_group(everyone_, kChannel);
  }
  void barrier() {
    double x = 0;
    comm_.all_reduce_sum(&x, 1, everyone_, kChannel);
  }
  void sum(std::vector<double>& v) { comm_.all_reduce_sum(v.data(), v.size(), everyone_, kChannel); }
  const std::vector<int>& everyone() const { return everyone_; }

 private:
  Communicator& comm_;
  std::vector<int> everyone_;
};

// Every region's F, B, BI and BW seconds (medians), run as the executor runs pieces: each region a
// piece of its own, chained, `inflight` microbatches forward before their backwards (so caches
// hold what they would in a pipeline, not one region's working set), once with whole backwards and
// once split into BI (all regions, last to first) then BW.
std::vector<std::array<double, 4>> time_regions(const RegionModel::Impl& impl, int64_t samples, int64_t seq, int inflight,
                                                int reps) {
  const size_t n = impl.modules.size();
  std::vector<PieceModules> pm(n);
  for (size_t r = 0; r < n; ++r) pm[r].plain = {impl.modules[r]};
  std::vector<std::array<std::vector<double>, 4>> t(n);
  const int warmup = 1;
  for (int i = 0; i < reps + warmup; ++i)
    for (bool split : {false, true}) {
      std::vector<std::vector<PieceIO>> io(static_cast<size_t>(inflight), std::vector<PieceIO>(n));
      std::vector<torch::Tensor> targets;
      for (auto& mb : io) {
        targets.push_back(torch::randint(impl.vocab, {samples, seq}, torch::kLong));
        const torch::Tensor& tg = targets.back();
        torch::Tensor x = torch::randint(impl.vocab, {samples, seq}, torch::kLong);
        for (size_t r = 0; r < n; ++r) {
          mb[r].inputs = {r == 0 ? x : x.detach().requires_grad_(true)};
          LossFn loss;
          if (r + 1 == n)  // the executor's loss, in fp32
            loss = [&tg](const torch::Tensor& logits) {
              const torch::Tensor l = logits.to(torch::kFloat);
              return at::cross_entropy_loss(l.reshape({-1, l.size(-1)}), tg.reshape({-1}));
            };
          const double t0 = now();
          run_forward(pm[r], mb[r], true, loss);
          if (i >= warmup && !split) t[r][0].push_back(now() - t0);
          x = mb[r].outputs.at(0);
        }
      }
      for (int m = inflight - 1; m >= 0; --m) {
        auto& mb = io[static_cast<size_t>(m)];
        const torch::Tensor& tg = targets[static_cast<size_t>(m)];
        torch::Tensor g;  // the gradient flowing back into region r's output
        for (size_t r = n; r-- > 0;) {
          LossFn loss;
          if (r + 1 == n)
            loss = [&tg](const torch::Tensor& logits) {
              const torch::Tensor l = logits.to(torch::kFloat);
              return at::cross_entropy_loss(l.reshape({-1, l.size(-1)}), tg.reshape({-1}));
            };
          const double t0 = now();
          run_backward(pm[r], mb[r], split ? ir::Op::BI : ir::Op::B, {g}, loss);
          if (i >= warmup) t[r][split ? 2 : 1].push_back(now() - t0);
          g = mb[r].grad_inputs.empty() ? torch::Tensor() : mb[r].grad_inputs.at(0);
        }
        if (split)
          for (size_t r = n; r-- > 0;) {
            const double t0 = now();
            run_backward(pm[r], mb[r], ir::Op::BW, {}, LossFn{});
            if (i >= warmup) t[r][3].push_back(now() - t0);
          }
      }
    }
  std::vector<std::array<double, 4>> out(n);
  for (size_t r = 0; r < n; ++r)
    for (size_t q = 0; q < 4; ++q) out[r][q] = median(t[r][q]);
  return out;
}

double time_update(int64_t elems, const std::string& kind, int reps) {
  FlatOptimizer opt(OptimizerOptions{.kind = kind});
  torch::Tensor p = torch::zeros({elems}), g = torch::randn({elems}) * 1e-3;
  opt.add(p, g);
  std::vector<double> t;
  torch::Tensor other = torch::zeros({16 << 20});  // 64 MiB: evicts the buffers, as a step's backward does
  for (int i = 0; i < reps + 2; ++i) {
    other.add_(1);
    const double t0 = now();
    opt.step();
    if (i >= 2) t.push_back(now() - t0);
  }
  return median(t);
}
}  // namespace

namespace {
// What the profile measured, summed over ranks where every rank measures.
struct Measured {
  std::vector<double> compute;  // [region][samples][F, B, BI, BW], then the optimizer at two sizes
  int64_t small = 0, big = 0;   // the optimizer's two sizes (elements)
  std::vector<size_t> p2p_sizes{4 << 10, 256 << 10, 4 << 20}, ar_sizes{64 << 10, 1 << 20, 4 << 20};
  std::vector<double> wire;     // one-way point-to-point, then all-reduce, seconds per size (rank 0's)
  std::vector<double> network;  // one-way between hosts per size, every pair at once (mean over pairs)
  int64_t ranks_per_host = 0;   // when every host holds as many ranks (0: they differ, or one host)
  int64_t ar_ranks = 0;         // the all-reduce's group size
  std::vector<double> network_ar;  // all-reduce across hosts per size (rank 0's group, all groups at once)
  int64_t across_ranks = 0;        // that group's size
};

// Every region at each microbatch size and the optimizer over flat buffers at two sizes, averaged over ranks.
void measure_compute(RegionModel::Impl& impl, int64_t seq, const ProfileOptions& o, Group& group, int ranks, Measured& m) {
  const size_t n = impl.modules.size(), ns = o.samples.size();
  int64_t param_elems = 0;
  for (auto& mod : impl.modules)
    for (auto p : mod.parameters()) {  // gradients exist up front, as the executor's flat views do
      p.set_requires_grad(true);
      p.mutable_grad() = torch::zeros_like(p);
      param_elems += p.numel();
    }
  group.barrier();  // every rank starts measuring together: they share the machine
  m.compute.assign(n * ns * 4, 0.0);
  torch::manual_seed(1234);
  for (size_t k = 0; k < ns; ++k) {
    const auto t = time_regions(impl, o.samples[k], seq, o.inflight, o.reps);
    for (size_t r = 0; r < n; ++r)
      for (size_t q = 0; q < 4; ++q) m.compute[(r * ns + k) * 4 + q] = t[r][q];
  }
  m.small = std::max<int64_t>(param_elems, 1 << 20);
  m.big = 4 * m.small;
  m.compute.push_back(time_update(m.small, o.optimizer, o.reps));
  m.compute.push_back(time_update(m.big, o.optimizer, o.reps));
  group.sum(m.compute);
  for (double& v : m.compute) v /= ranks;
}

// One way between this rank and `peer` (the one who sends first is `first`), median over reps.
double ping_pong(Communicator& comm, size_t bytes, int peer, bool first, int reps) {
  std::vector<char> buf(bytes);
  std::vector<double> t;
  for (int rep = 0; rep < reps + 2; ++rep) {
    const double t0 = now();
    if (first) {
      comm.send(buf.data(), bytes, peer, kTag);
      comm.recv(buf.data(), bytes, peer, kTag);
    } else {
      comm.recv(buf.data(), bytes, peer, kTag);
      comm.send(buf.data(), bytes, peer, kTag);
    }
    if (rep >= 2) t.push_back((now() - t0) / 2);  // one way
  }
  return median(t);
}

// An all-reduce over `ranks` per size (this rank's median): every rank calls it, each with its own
// group, so groups that do not overlap run at once.
std::vector<double> time_all_reduce(Communicator& comm, Group& group, const std::vector<size_t>& sizes,
                                    const std::vector<int>& ranks, int reps) {
  comm.prepare_group(ranks, kChannel);
  std::vector<float> data(sizes.back() / sizeof(float), 1.0f);
  std::vector<double> out;
  for (size_t bytes : sizes) {
    std::vector<double> t;
    for (int rep = 0; rep < reps + 2; ++rep) {
      group.barrier();
      const double t0 = now();
      comm.all_reduce_sum(data.data(), bytes / sizeof(float), ranks, kChannel);
      if (rep >= 2) t.push_back(now() - t0);
    }
    out.push_back(median(t));
  }
  return out;
}

// Communication, measured by rank 0 (with rank 1 for point-to-point) and shared by the sum.
void measure_wire(Communicator& comm, const ProfileOptions& o, Group& group, Measured& m) {
  m.wire.assign(m.p2p_sizes.size() + m.ar_sizes.size(), 0.0);
  if (comm.size() >= 2) {
    for (size_t i = 0; i < m.p2p_sizes.size(); ++i) {
      group.barrier();
      if (comm.rank() <= 1) {
        const double t = ping_pong(comm, m.p2p_sizes[i], 1 - comm.rank(), comm.rank() == 0, o.reps);
        if (comm.rank() == 0) m.wire[i] = t;
      }
    }
    // Across hosts, the collectives' own link is the one inside a host: each host all-reduces among
    // its ranks (all hosts at once); what crosses is measured by measure_network.
    const HostMap hosts = comm.hosts();
    std::vector<int> local;
    for (int r = 0; r < comm.size(); ++r)
      if (hosts.host_of[size_t(r)] == hosts.host_of[size_t(comm.rank())]) local.push_back(r);
    if (local.size() < 2) local = group.everyone();  // one rank a host: only the crossing ring exists
    m.ar_ranks = int64_t(local.size());
    const auto t = time_all_reduce(comm, group, m.ar_sizes, local, o.reps);
    if (comm.rank() == 0) std::copy(t.begin(), t.end(), m.wire.begin() + ptrdiff_t(m.p2p_sizes.size()));
  }
  group.sum(m.wire);
}

// Between hosts: the i-th rank of host 0 and the i-th of host 1 ping-pong, every such pair at once
// (as a pipeline's stages send at once), so the figure is what one rank gets of the hosts' link
// while its neighbours use it too. Then the all-reduce across hosts as data parallelism over hosts
// runs it: the i-th ranks of every host a group, all groups at once (both directions of every link
// busy, which a ping-pong does not show).
void measure_network(Communicator& comm, const ProfileOptions& o, Group& group, Measured& m) {
  const HostMap hosts = comm.hosts();
  if (hosts.count() < 2) return;
  std::vector<std::vector<int>> on(hosts.count());
  for (int r = 0; r < comm.size(); ++r) on[size_t(hosts.host_of[size_t(r)])].push_back(r);
  m.ranks_per_host = int64_t(on[0].size());
  for (const auto& h : on)
    if (h.size() != on[0].size()) m.ranks_per_host = 0;
  const size_t pairs = std::min(on[0].size(), on[1].size());
  int peer = -1;
  bool first = false;
  for (size_t i = 0; i < pairs; ++i) {
    if (on[0][i] == comm.rank()) peer = on[1][i], first = true;
    if (on[1][i] == comm.rank()) peer = on[0][i];
  }
  m.network.assign(m.p2p_sizes.size(), 0.0);
  for (size_t i = 0; i < m.p2p_sizes.size(); ++i) {
    group.barrier();
    const double t = peer >= 0 ? ping_pong(comm, m.p2p_sizes[i], peer, first, o.reps) : 0.0;
    if (first) m.network[i] = t;
  }
  group.sum(m.network);
  for (double& v : m.network) v /= double(pairs);
  std::vector<int> across;  // the ranks with this rank's index on their hosts
  const auto& mine = on[size_t(hosts.host_of[size_t(comm.rank())])];
  const size_t index = size_t(std::find(mine.begin(), mine.end(), comm.rank()) - mine.begin());
  for (const auto& h : on)
    if (index < h.size()) across.push_back(h[index]);
  m.across_ranks = int64_t(hosts.count());
  m.network_ar = time_all_reduce(comm, group, m.ar_sizes, across, o.reps);
  if (comm.rank() != 0) std::fill(m.network_ar.begin(), m.network_ar.end(), 0.0);  // rank 0's group
  group.sum(m.network_ar);
}

// The machine description: regions' lines, the optimizer, the links, and what it was measured on.
json describe(const RegionModel::Impl& impl, const Measured& m, const std::string& model_path, int64_t seq, int ranks,
              const ProfileOptions& o) {
  const size_t n = impl.modules.size(), ns = o.samples.size();
  std::vector<double> xs(o.samples.begin(), o.samples.end());
  json regions = json::object();
  const std::vector<double> flops = sequence_flops(json::parse(impl.manifest), impl.sequence);
  double flop_sum = 0, f_time = 0;
  for (size_t r = 0; r < n; ++r) {
    json entry = json::object();
    const char* names[4] = {"F", "B", "BI", "BW"};
    for (size_t q = 0; q < 4; ++q) {
      std::vector<double> ys;
      for (size_t k = 0; k < ns; ++k) ys.push_back(m.compute[(r * ns + k) * 4 + q]);
      entry[names[q]] = line(fit(xs, ys));
    }
    regions[impl.sequence[r]] = entry;
    flop_sum += flops[r] * xs.back();
    f_time += m.compute[(r * ns + ns - 1) * 4];
  }
  const double elem_bytes = sizeof(float);
  const auto update = fit({double(m.small) * elem_bytes, double(m.big) * elem_bytes}, {m.compute[n * ns * 4], m.compute[n * ns * 4 + 1]});
  json out;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  out["name"] = fmt::format("profiled on {}: {} ranks x {} threads", host, ranks, o.threads);
  out["comment"] =
      "Written by piper-run --profile: regions' chunk times in seconds per microbatch as [fixed, per sample], the "
      "optimizer step as [fixed, per parameter byte]; links fitted to one-way point-to-point and to all-reduce times.";
  out["profile"] = {{"model", model_path}, {"ranks", ranks}, {"threads", o.threads}, {"seq_len", seq},
                    {"samples", o.samples}, {"reps", o.reps}, {"optimizer", o.optimizer}};
  out["flops"] = f_time > 0 && flop_sum > 0 ? flop_sum / f_time : 1e9;  // for what is priced by FLOPs
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  out["memory_bytes"] = pages > 0 && page > 0 ? double(pages) * double(page) / ranks : 0.0;
  out["memory_bandwidth"] = update.second > 0 ? 16.0 / update.second : 1e10;
  out["update"] = line(update);
  if (ranks >= 2) {
    const auto np2p = static_cast<long>(m.p2p_sizes.size());
    std::vector<double> px(m.p2p_sizes.begin(), m.p2p_sizes.end()), ax(m.ar_sizes.begin(), m.ar_sizes.end());
    const auto p2p = fit(px, std::vector<double>(m.wire.begin(), m.wire.begin() + np2p));
    const auto ar = fit(ax, std::vector<double>(m.wire.begin() + np2p, m.wire.end()));
    // Ring all-reduce: 2(k-1) latencies and 2(k-1)/k of the bytes over the link.
    out["link"] = {{"bandwidth", p2p.second > 0 ? 1.0 / p2p.second : 1e12}, {"latency", std::max(0.0, p2p.first)}};
    const double kl = double(m.ar_ranks);
    out["collectives"] = {{"bandwidth", ar.second > 0 ? 2 * (kl - 1) / kl / ar.second : 1e12},
                          {"latency", std::max(0.0, ar.first / (2 * (kl - 1)))}};
    if (!m.network.empty()) {
      const auto net = fit(px, m.network);
      out["network"] = {{"bandwidth", net.second > 0 ? 1.0 / net.second : 1e12}, {"latency", std::max(0.0, net.first)}};
      const auto nar = fit(ax, m.network_ar);
      const double kn = double(m.across_ranks);
      out["network_collectives"] = {{"bandwidth", nar.second > 0 ? 2 * (kn - 1) / kn / nar.second : 1e12},
                                    {"latency", std::max(0.0, nar.first / (2 * (kn - 1)))}};
      if (m.ranks_per_host > 0) out["ranks_per_host"] = m.ranks_per_host;
    }
  } else {
    out["link"] = {{"bandwidth", 1e12}, {"latency", 0.0}};
    out["comment"] = out["comment"].get<std::string>() + " One rank: nothing is communicated, so links were not measured.";
  }
  out["regions"] = regions;
  return out;
}
}  // namespace

std::string profile_machine(const std::string& model_path, Communicator& comm, const ProfileOptions& o) {
  plain_interpreter();
  RegionModel model(model_path);
  auto& impl = model.impl();
  const int64_t seq = o.seq_len > 0 ? std::min(o.seq_len, impl.seq_len) : impl.seq_len;
  Group group(comm);
  Measured m;
  measure_compute(impl, seq, o, group, comm.size(), m);
  measure_wire(comm, o, group, m);
  measure_network(comm, o, group, m);
  if (comm.rank() != 0) return "";
  return describe(impl, m, model_path, seq, comm.size(), o).dump(2) + "\n";
}

namespace {
// Rank 0's text on every rank (the others pass anything): every rank then compiles the same plan.
std::string from_rank0(Communicator& comm, std::string text) {
  constexpr int kLenTag = kTag + 1, kDataTag = kTag + 2;
  if (comm.rank() == 0) {
    for (int r = 1; r < comm.size(); ++r) {
      uint64_t len = text.size();
      comm.send(&len, sizeof len, r, kLenTag);
      comm.send(text.data(), text.size(), r, kDataTag);
    }
    return text;
  }
  uint64_t len = 0;
  comm.recv(&len, sizeof len, 0, kLenTag);
  std::string out(len, '\0');
  comm.recv(out.data(), len, 0, kDataTag);
  return out;
}

// A plan of `strategy` over every rank for a batch of `batch` samples, priced by `machine`; on a
// strategy the model cannot take, nothing and the errors in *error.
std::optional<sched::Plan> calibration_plan(const std::string& model_path, const std::string& strategy, int64_t batch,
                                            const std::string& machine, int ranks, std::string* error) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  auto model = load_model(model_path, sources, diags);
  sched::PlanOptions po;
  po.cmd.np = ranks;
  po.cmd.batch_size = batch;
  po.machine_text = machine;
  sched::PlanResult r;
  if (model.manifest) r = sched::compile_plan(sources.add("<calibration>", strategy), *model.manifest, po, sources, diags);
  if (!r.plan) *error = "calibration plan: " + sched::render_errors(r, diags) + model.io_error;
  return std::move(r.plan);
}

// Data parallelism over every rank, 4 microbatches of 2 samples each, replicated as `replicate`.
sched::Plan dp_plan(const std::string& model_path, const std::string& replicate, const std::string& machine, int ranks) {
  std::string error;
  auto plan = calibration_plan(model_path, fmt::format("mesh dp = {};\nsplit batch into 4;\n{}\n", ranks, replicate), 8 * ranks,
                               machine, ranks, &error);
  if (!plan) throw std::runtime_error(error);
  return std::move(*plan);
}

// 1F1B over every rank, the model cut into as many stages by cost, 8 microbatches of 2 samples:
// the handoffs a pipeline waits for. Nothing where the model has fewer pipeline regions than ranks.
std::optional<sched::Plan> pipeline_plan(const std::string& model_path, const std::string& machine, int ranks,
                                         std::string* error) {
  return calibration_plan(model_path,
                          fmt::format("mesh pp = {0};\nsplit batch into 8;\nplace * over pp balanced;\n"
                                      "order fwd(s, i) -> fwd(s, i + 1);\norder bwd(s, i) -> bwd(s, i + 1);\n"
                                      "order bwd(s, i) -> fwd(s, i + {0} - s);\n",
                                      ranks),
                          16, machine, ranks, error);
}
}  // namespace

std::string profile_and_calibrate(const std::string& model_path, const TokenData& data, Communicator& comm, const ProfileOptions& o) {
  std::string machine = from_rank0(comm, profile_machine(model_path, comm, o));
  // Compute: a data-parallel step on every rank, priced by what was just measured and then run.
  machine = from_rank0(comm, calibrate_machine(machine, dp_plan(model_path, "replicate * over dp;", machine, comm.size()),
                                               model_path, data, comm, 4,
                                               fmt::format("dp over {} ranks, 4 microbatches of 2 samples", comm.size())));
  if (comm.size() < 2) return comm.rank() == 0 ? machine : "";
  // Then the collectives as the executor issues them: ZeRO-3 gathers and reduce-scatters every layer
  // of every microbatch, priced by the machine calibrated so far.
  const auto zero3 = dp_plan(model_path, "replicate * over dp zero 3 prefetch 0;", machine, comm.size());
  machine = from_rank0(comm, calibrate_machine(machine, zero3, model_path, data, comm, 4,
                                               fmt::format("ZeRO-3 over {} ranks, 4 microbatches of 2 samples", comm.size()),
                                               Calibrate::Collectives));
  // Last the handoffs a pipeline waits for, priced by everything calibrated before (every rank
  // compiles the same text, so all agree whether the model can be cut into as many stages).
  std::string why;
  const auto pipeline = pipeline_plan(model_path, machine, comm.size(), &why);
  if (!pipeline) {  // the machine file says why sends carry no calibration
    if (comm.rank() != 0) return "";
    json m = json::parse(machine);
    m["calibration"]["p2p_measured_on"] = "not measured: " + why.substr(0, why.find('\n'));
    return m.dump(2) + "\n";
  }
  return calibrate_machine(machine, *pipeline, model_path, data, comm, 4,
                           fmt::format("1F1B over {} ranks, 8 microbatches of 2 samples", comm.size()), Calibrate::Handoffs);
}

std::string calibrate_machine(const std::string& machine_json, const sched::Plan& plan, const std::string& model_path,
                              const TokenData& data, Communicator& comm, int steps, const std::string& described,
                              Calibrate what) {
  const int64_t batch = plan.samples_per_microbatch() * plan.dag.facts.microbatches * plan.dag.facts.mesh.replicas(plan.dag.facts.pipeline_axis);
  Executor ex(plan, model_path, data, comm, ExecutorOptions{.global_batch = batch});
  // [F, B, U, collectives] x [measured, simulated], this rank's; then the number of collectives.
  std::vector<double> t(9, 0.0);
  auto slot = [](ir::Op op) -> int {
    switch (op) {
      case ir::Op::F: return 0;
      case ir::Op::B:
      case ir::Op::BI:
      case ir::Op::BW: return 1;
      case ir::Op::U: return 2;
      case ir::Op::AllReduce:
      case ir::Op::AllGather:
      case ir::Op::ReduceScatter:
      case ir::Op::AllToAll: return 3;
      default: return -1;
    }
  };
  const int32_t cls = plan.schedule.class_of_rank(comm.rank());
  for (size_t v = 0; v < plan.dag.nodes.size(); ++v)
    if (int k = slot(plan.dag.nodes[v].op); k >= 0 && plan.schedule.node_class[v] == cls) {
      t[size_t(2 * k + 1)] += (steps - 1) * (plan.schedule.finish[v] - plan.schedule.start[v]);
      if (k == 3) t[8] += steps - 1;
    }
  std::vector<StepResult> ran;
  for (int s = 0; s < steps; ++s) {
    StepResult r = ex.step(s);
    if (s == 0) continue;  // the first step allocates what the others reuse
    for (const OpSpan& op : r.ops)
      if (auto n = ir::parse_token(op.token))
        if (int k = slot(n->op); k >= 0) t[size_t(2 * k)] += op.end - op.start;
    ran.push_back(std::move(r));
  }
  Group group(comm);
  group.sum(t);
  const HandoffWaits waits = what == Calibrate::Handoffs ? handoff_waits(plan, ran, comm) : HandoffWaits{};
  if (comm.rank() != 0) return "";
  json m = json::parse(machine_json);
  auto ratio = [&](int k) { return t[size_t(2 * k + 1)] > 0 ? t[size_t(2 * k)] / t[size_t(2 * k + 1)] : 1.0; };
  if (what == Calibrate::Compute) {
    m["calibration"] = {{"F", ratio(0)}, {"B", ratio(1)}, {"U", ratio(2)}, {"measured_on", described}};
  } else if (what == Calibrate::Handoffs) {
    // The simulated sends were priced with this machine's calibration so far (none added).
    const double extra = waits.count > 0 ? std::max(0.0, waits.excess / double(waits.count)) : 0.0;
    m["calibration"]["p2p"] = m["calibration"].value("p2p", 0.0) + extra;
    m["calibration"]["p2p_measured_on"] = fmt::format("{}: {} handoffs waited for", described, waits.count);
  } else {
    // The simulated collectives were priced with this machine's calibration so far (none added).
    const double extra = t[8] > 0 ? std::max(0.0, (t[6] - t[7]) / t[8]) : 0.0;
    m["calibration"]["collective"] = m["calibration"].value("collective", 0.0) + extra;
    m["calibration"]["collective_measured_on"] = described;
  }
  return m.dump(2) + "\n";
}

}  // namespace piper::runtime
