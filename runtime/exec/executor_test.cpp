#include "runtime/exec/executor.h"
#include "runtime/view/rank_view.h"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <torch/script.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <fstream>
#include <thread>

#include "runtime/view/device_streams.h"
#include "runtime/device/fake_device.h"
#include "runtime/comm/fake_nccl.h"
#include "runtime/model/model_zoo.h"
#include "runtime/comm/nccl_communicator.h"
#include "tests/scratch_file.h"

using namespace piper;
using namespace piper::runtime;
namespace fs = std::filesystem;

namespace {
const std::string kData = std::string(PIPER_SOURCE_DIR) + "/data/corpus.txt";

std::string make_model(const std::string& arch, const piper::testing::ScratchFile& file) {
  ModelConfig c;
  c.arch = arch;
  c.layers = 4;
  c.d_model = 32;
  c.ffn = 64;
  c.seq = 16;
  c.experts = 4;
  save_model(c, file.path());
  return file.path();
}
std::string tiny_model() {
  static const piper::testing::ScratchFile file("piper-exec-gpt", ".pt");
  static const std::string path = make_model("gpt", file);
  return path;
}
std::string tiny_moe() {
  static const piper::testing::ScratchFile file("piper-exec-moe", ".pt");
  static const std::string path = make_model("moe", file);
  return path;
}

// The single-device oracle: whole-model forward, cross-entropy, AdamW — as piper-train-ref does.
std::vector<double> reference(int steps, int64_t batch, const std::string& path = tiny_model(),
                              const std::string& optimizer = "adamw") {
  auto model = torch::jit::load(path);
  std::vector<torch::Tensor> params;
  for (auto p : model.parameters()) {
    p.set_requires_grad(true);
    params.push_back(p);
  }
  std::unique_ptr<torch::optim::Optimizer> opt_ptr;
  if (optimizer == "adamw")
    opt_ptr = std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-3).weight_decay(0.0));
  else
    opt_ptr = std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(1e-1));
  auto& opt = *opt_ptr;
  TokenData data(kData);
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    auto b = data.batch(0, static_cast<uint64_t>(s), batch, 0, batch, 16);
    auto t = torch::from_blob(b.data(), {batch, 17}, torch::kLong).clone();
    auto logits = model.forward({t.slice(1, 0, 16)}).toTensor();
    auto loss = at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), t.slice(1, 1).reshape({-1}));
    opt.zero_grad();
    loss.backward();
    opt.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

// A library strategy compiled for `world` ranks and `batch` samples, as piper-run would.
std::optional<sched::Plan> compile(const std::string& strategy, std::vector<std::string> sets, int world, int64_t batch,
                                   const std::string& model = tiny_model()) {
  sched::PlanOptions opt;
  opt.cmd.np = world;
  opt.cmd.sets = std::move(sets);
  opt.cmd.batch_size = batch;
  opt.cmd.search_path = default_search_path();
  std::string errors;
  auto plan = sched::compile_plan(model, std::string(PIPER_STRATEGY_DIR) + "/" + strategy, opt, &errors);
  REQUIRE_MESSAGE(plan, errors);
  return plan;
}

// Every rank of the plan as a thread with its own executor and an in-process communicator.
std::vector<double> distributed(const std::string& strategy, std::vector<std::string> sets, int world, int steps,
                                int64_t batch, const std::string& model = tiny_model(), const std::string& optimizer = "adamw",
                                int64_t* expert_bytes = nullptr, bool through_nccl = false,
                                const std::string& stream_device = "", DeviceStreamPlan* device_plans = nullptr) {
  auto plan = compile(strategy, std::move(sets), world, batch, model);
  auto comms = make_fake_world(world);
  FakeNcclWorld nccl;
  if (through_nccl)  // the NCCL communicator over a fake NCCL, bootstrapped by the fake MPI world
    for (int r = 0; r < world; ++r)
      comms[static_cast<size_t>(r)] = make_nccl_communicator(std::move(comms[static_cast<size_t>(r)]), nccl.api(r));
  TokenData data(kData);
  std::vector<std::vector<double>> losses(static_cast<size_t>(world));
  std::vector<std::string> failures(static_cast<size_t>(world));
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r)
    ranks.emplace_back([&, r] {
      try {
        ExecutorOptions o{batch, optimizer == "adamw" ? 1e-3 : 1e-1, optimizer, 0};
        o.stream_device = stream_device;
        Executor ex(*plan, model, data, *comms[static_cast<size_t>(r)], o);
        for (int s = 0; s < steps; ++s) losses[static_cast<size_t>(r)].push_back(ex.step(s).loss);
      } catch (const std::exception& e) {
        failures[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  for (const auto& f : failures) REQUIRE_MESSAGE(f.empty(), f);
  for (const auto& l : losses) CHECK(l == losses.front());  // every rank reports the same loss
  if (device_plans) {  // the waits and records all ranks' device plans ask for in a step
    *device_plans = DeviceStreamPlan{};
    for (int r = 0; r < world; ++r) {
      const DeviceStreamPlan dp = plan_device_streams(*plan, make_rank_view(*plan, r, world, (1 << 30) - 1));
      device_plans->waits += dp.waits;
      for (const auto& prog : dp.programs)
        for (const auto& st : prog) device_plans->events += st.record >= 0;
    }
  }
  if (through_nccl) CHECK(!nccl.log(0).empty());  // its communicators were made, so NCCL carried the traffic
  if (expert_bytes) {
    *expert_bytes = 0;
    for (const auto& c : comms)  // every stream's expert channel
      for (ir::StreamId s = 0; s < static_cast<ir::StreamId>(plan->dag.streams.size()); ++s) *expert_bytes += c->bytes_sent(expert_channel(s));
  }
  return losses.front();
}

void same_losses(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));
  }
}
}  // namespace

TEST_CASE("in-process ranks train to the single-device losses: pipelines, data parallelism, both") {
  torch::set_num_threads(1);
  const int steps = 6;
  const int64_t batch = 8;
  auto want = reference(steps, batch);
  CHECK(want.back() < want.front());
  SUBCASE("single") { same_losses(distributed("single.piper", {"mb=2"}, 1, steps, batch), want); }
  SUBCASE("dp=2") { same_losses(distributed("dp.piper", {"dp=2"}, 2, steps, batch), want); }
  SUBCASE("gpipe pp=2 m=4") { same_losses(distributed("gpipe.piper", {"pp=2", "mb=4"}, 2, steps, batch), want); }
  SUBCASE("1f1b pp=2 m=4") { same_losses(distributed("1f1b.piper", {"pp=2", "mb=4"}, 2, steps, batch), want); }
  SUBCASE("1f1b pp=4 m=8") { same_losses(distributed("1f1b.piper", {"pp=4", "mb=8"}, 4, steps, batch), want); }
  SUBCASE("interleaved pp=2 v=2 m=4") {
    same_losses(distributed("interleaved_1f1b.piper", {"pp=2", "v=2", "mb=4"}, 2, steps, batch), want);
  }
  SUBCASE("zb1p pp=2 m=4") { same_losses(distributed("zb1p.piper", {"pp=2", "mb=4"}, 2, steps, batch), want); }
  SUBCASE("dualpipev pp=2 m=4") { same_losses(distributed("dualpipev.piper", {"pp=2", "mb=4"}, 2, steps, batch), want); }
  SUBCASE("zero1 dp=2") { same_losses(distributed("zero1.piper", {"dp=2"}, 2, steps, batch), want); }
  SUBCASE("zero2 dp=2 with 2 microbatches and small buckets") {
    same_losses(distributed("../tests/strategies/zero2_mb2_buckets.piper", {"dp=2"}, 2, steps, batch), want);
  }
  SUBCASE("1f1b pp=2 x zero2 dp=2") {
    same_losses(distributed("1f1b_zero2.piper", {"pp=2", "dp=2", "mb=2"}, 4, steps, batch), want);
  }
  SUBCASE("zero3 dp=2") { same_losses(distributed("zero3.piper", {"dp=2"}, 2, steps, batch), want); }
  SUBCASE("1f1b pp=2 x zero3 dp=2, 2 microbatches") {
    same_losses(distributed("1f1b_zero3.piper", {"pp=2", "dp=2", "mb=2"}, 4, steps, batch), want);
  }
  SUBCASE("zero3 dp=2 with uneven units, prefetch 2, 2 microbatches") {
    same_losses(distributed("../tests/strategies/zero3_units.piper", {"dp=2"}, 2, steps, batch), want);
  }
  SUBCASE("zb1p pp=2 x zero3 dp=2") {
    same_losses(distributed("../tests/strategies/zb1p_zero3.piper", {"pp=2", "dp=2", "mb=2"}, 4, steps, batch), want);
  }
  SUBCASE("1f1b pp=2 m=4 with recompute") {
    same_losses(distributed("../tests/strategies/1f1b_recompute.piper", {"pp=2", "mb=4"}, 2, steps, batch), want);
  }
}

TEST_CASE("in-process expert parallelism trains to the single-device losses: EP alone, DualPipeV x EP") {
  torch::set_num_threads(1);
  const int steps = 5;
  const int64_t batch = 8;
  auto want = reference(steps, batch, tiny_moe());
  SUBCASE("ep=2") {
    same_losses(distributed("../tests/strategies/ep2.piper", {}, 2, steps, batch, tiny_moe()), want);
  }
  SUBCASE("1f1b pp=2 x ep=2") {
    same_losses(distributed("../tests/strategies/1f1b_ep.piper", {"pp=2", "mb=2", "ep=2"}, 4, steps, batch, tiny_moe()), want);
  }
  SUBCASE("dualpipev pp=2 x ep=2") {
    same_losses(distributed("dualpipev_ep.piper", {"pp=2", "mb=4", "ep=2"}, 4, steps, batch, tiny_moe()), want);
  }
  SUBCASE("ep=2 x ZeRO-1, ZeRO-2, ZeRO-3 over the same axis") {
    for (int zero : {1, 2, 3}) {
      CAPTURE(zero);
      same_losses(distributed("../tests/strategies/ep2_zero.piper", {fmt::format("z={}", zero), "mb=2"}, 2, steps,
                              batch, tiny_moe()),
                  want);
    }
  }
}

TEST_CASE("on a device, each logical stream launches on a stream of its own, waiting through events") {
  // A fake device's streams (tensors stay on the CPU): every wait the rank's device plan keeps
  // reaches the device after the record it means, on the waiting thread's own stream, and the
  // losses are the single device's.
  torch::set_num_threads(1);
  const std::string fake = install_fake_device();
  const int steps = 3;
  const int64_t batch = 8;
  auto run = [&](const std::string& strategy, std::vector<std::string> sets, int world, const std::string& model) {
    reset_fake_device_counts();
    DeviceStreamPlan want;
    auto got = distributed(strategy, std::move(sets), world, steps, batch, model, "adamw", nullptr, false, fake, &want);
    same_losses(got, reference(steps, batch, model));
    const FakeDeviceCounts c = fake_device_counts();
    for (const auto& e : c.errors) FAIL_CHECK(e);
    CHECK(want.waits > 0);  // the plan crosses streams
    CHECK(c.blocks == steps * want.waits);
    CHECK(c.records == steps * want.events);
    CHECK(c.synchronizes > 0);  // the communicator waited for the kernels before the library read
    return c;
  };
  SUBCASE("dp=2: gradient buckets on the comm stream") { run("dp.piper", {"dp=2"}, 2, tiny_model()); }
  SUBCASE("1f1b pp=2 x zero3 dp=2: gathered units kept for the stream that computes with them") {
    CHECK(run("1f1b_zero3.piper", {"pp=2", "dp=2", "mb=2"}, 4, tiny_model()).kept > 0);
  }
  SUBCASE("dualpipev pp=2 x ep=2: all-to-alls beside the overlapped pairs") {
    CHECK(run("dualpipev_ep.piper", {"pp=2", "mb=4", "ep=2"}, 4, tiny_moe()).kept > 0);
  }
}

TEST_CASE("--device names a device this LibTorch and machine have") {
  const auto plan = [] {
    sched::PlanOptions opt;
    opt.cmd.np = 1;
    opt.cmd.batch_size = 8;
    opt.cmd.search_path = default_search_path();
    std::string errors;
    return sched::compile_plan(tiny_model(), std::string(PIPER_STRATEGY_DIR) + "/single.piper", opt, &errors);
  }();
  REQUIRE(plan);
  auto comms = make_fake_world(1);
  TokenData data(kData);
  auto start = [&](const std::string& device) {
    ExecutorOptions o{8, 1e-3, "adamw", 0};
    o.device = device;
    Executor ex(*plan, tiny_model(), data, *comms[0], o);
  };
  CHECK_THROWS_WITH_AS(start("gpu"), doctest::Contains("--device 'gpu': expected cpu, cuda or cuda:N"), std::runtime_error);
  if (!torch::cuda::is_available())  // Debian's LibTorch has no CUDA; one that has, on a machine without a GPU
    CHECK_THROWS_WITH_AS(start("cuda"), doctest::Contains("device 'cuda'"), std::runtime_error);
}

TEST_CASE("in-process ranks train to the single-device losses through the NCCL communicator (fake NCCL)") {
  // Every kind of traffic the executor makes: p2p, all-reduce, ZeRO-3's uneven reduce-scatters and
  // gathers, the tie's and the experts' all-to-all-v, through the NCCL backend's staging and headers.
  torch::set_num_threads(1);
  const int steps = 4;
  const int64_t batch = 8;
  auto want = reference(steps, batch);
  SUBCASE("1f1b pp=2 m=4") {
    same_losses(distributed("1f1b.piper", {"pp=2", "mb=4"}, 2, steps, batch, tiny_model(), "adamw", nullptr, true), want);
  }
  SUBCASE("1f1b pp=2 x zero3 dp=2") {
    same_losses(distributed("1f1b_zero3.piper", {"pp=2", "dp=2", "mb=2"}, 4, steps, batch, tiny_model(), "adamw",
                            nullptr, true),
                want);
  }
  SUBCASE("dualpipev pp=2 x ep=2") {
    auto want_moe = reference(steps, batch, tiny_moe());
    int64_t bytes = 0;
    same_losses(distributed("dualpipev_ep.piper", {"pp=2", "mb=4", "ep=2"}, 4, steps, batch, tiny_moe(), "adamw", &bytes,
                            true),
                want_moe);
    CHECK(bytes > 0);  // counted by the NCCL backend as by the others
  }
}

TEST_CASE("token data past the model's vocabulary is refused up front, naming the token") {
  std::string bytes;
  for (int i = 0; i < 200; ++i) {
    const uint16_t t = i == 150 ? 300 : static_cast<uint16_t>(i % 200);  // the tiny model's vocabulary is 256
    bytes += std::string{char(t & 0xff), char(t >> 8)};
  }
  const auto path = (fs::temp_directory_path() / ("piper-vocab-" + std::to_string(::getpid()) + ".bin")).string();
  std::ofstream(path, std::ios::binary) << bytes;
  auto plan = compile("single.piper", {}, 1, 2);
  auto comms = make_fake_world(1);
  TokenData data(path);
  CHECK_THROWS_WITH(Executor(*plan, tiny_model(), data, *comms[0], ExecutorOptions{2, 1e-3, "adamw", 0}),
                    doctest::Contains("the data has token 300 (at position 150) but the model's vocabulary is 256"));
  fs::remove(path);
}

TEST_CASE("expert parallelism is sparse: a token travels only to the ranks of its chosen experts") {
  torch::set_num_threads(1);
  const int steps = 2;
  const int64_t batch = 8, seq = 16, layers = 4, d = 32, top_k = ModelConfig{}.top_k;
  int64_t bytes = 0;
  distributed("../tests/strategies/ep2.piper", {}, 2, steps, batch, tiny_moe(), "adamw", &bytes);
  // Dispatch and combine, forward and backward: at most top_k remote copies of a token's hidden
  // state each way (the gates and the token counts ride along: a few floats a token).
  const double per_token_layer = double(bytes) / double(steps * batch * seq * layers);
  const double bound = 2.0 * double(top_k * d * 4 * 2);
  MESSAGE("expert exchange: " << per_token_layer << " bytes per token per MoE layer, forward and backward (bound " << bound
                              << ")");
  CHECK(bytes > 0);
  CHECK(per_token_layer <= bound);
}

TEST_CASE("expert gradients are the global batch's: SGD (not scale-invariant like AdamW) agrees too") {
  torch::set_num_threads(1);
  auto want = reference(4, 8, tiny_moe(), "sgd");
  same_losses(distributed("../tests/strategies/ep2.piper", {}, 2, 4, 8, tiny_moe(), "sgd"), want);
  same_losses(distributed("dualpipev_ep.piper", {"pp=2", "mb=4", "ep=2"}, 4, 4, 8, tiny_moe(), "sgd"), want);
}

namespace {
// The fake world's communicator, except that its sends, once started, fail (as a lost link would):
// the message still reaches the peer, so only the sender learns of it.
class FailingSends : public Communicator {
 public:
  explicit FailingSends(Communicator& inner) : in_(inner) {}
  int rank() const override { return in_.rank(); }
  int size() const override { return in_.size(); }
  void send(const void* d, size_t b, int p, int t) override { in_.send(d, b, p, t); }
  void recv(void* d, size_t b, int p, int t) override { in_.recv(d, b, p, t); }
  std::unique_ptr<PendingSend> start_send(const void* d, size_t b, int p, int t) override {
    struct Lost : PendingSend {
      std::unique_ptr<PendingSend> real;
      bool done() override { return real->done() ? throw std::runtime_error("link lost") : false; }
      void wait() override {
        real->wait();
        throw std::runtime_error("link lost");
      }
    };
    auto out = std::make_unique<Lost>();
    out->real = in_.start_send(d, b, p, t);
    return out;
  }
  void all_reduce_sum(float* d, size_t n, const std::vector<int>& g, int c) override { in_.all_reduce_sum(d, n, g, c); }
  void all_reduce_sum(double* d, size_t n, const std::vector<int>& g, int c) override { in_.all_reduce_sum(d, n, g, c); }
  void reduce_scatter_sum(const float* i, float* o, const std::vector<size_t>& off, const std::vector<int>& g, int c) override {
    in_.reduce_scatter_sum(i, o, off, g, c);
  }
  void all_gather(const float* i, float* o, const std::vector<size_t>& off, const std::vector<int>& g, int c) override {
    in_.all_gather(i, o, off, g, c);
  }
  void all_to_all_v(const void* s, const std::vector<size_t>& sb, void* r, const std::vector<size_t>& rb, const std::vector<int>& g,
                    int c) override {
    in_.all_to_all_v(s, sb, r, rb, g, c);
  }
  [[noreturn]] void abort(const std::string& why) override { in_.abort(why); }

 private:
  Communicator& in_;
};
}  // namespace

TEST_CASE("a send that fails after it was started ends the step on both ranks, the sender naming it") {
  // 1F1B pp=2 with more microbatches than stages: rank 0's sends are in flight while it computes.
  auto plan = compile("1f1b.piper", {"pp=2", "mb=4"}, 2, 8);
  auto comms = make_fake_world(2);
  FailingSends failing(*comms[0]);
  TokenData data(kData);
  std::vector<std::string> failures(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      try {
        Executor ex(*plan, tiny_model(), data, r == 0 ? static_cast<Communicator&>(failing) : *comms[1], ExecutorOptions{8, 1e-3, "adamw", 0});
        ex.step(0);
      } catch (const std::exception& e) {
        failures[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  CHECK_MESSAGE(failures[0].find("(started earlier): link lost") != std::string::npos, failures[0]);
  CHECK_MESSAGE(failures[0].find("0SEND_F") != std::string::npos, failures[0]);
  CHECK_FALSE(failures[1].empty());  // the peer does not wait on: the job ended
}
