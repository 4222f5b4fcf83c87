// The NCCL communicator's logic without a GPU: the fake NCCL under it, the fake MPI world as its
// bootstrap. Group creation order, the unique-id exchange, staging and padding of uneven parts,
// point-to-point headers and the asynchronous-error path.
#include "runtime/comm/nccl_communicator.h"

#include <doctest/doctest.h>

#include <chrono>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <thread>

#include "runtime/comm/fake_nccl.h"

using namespace piper::runtime;

namespace {
// Runs fn on every rank, each on its own thread; returns each rank's exception message ("" if none).
std::vector<std::string> on_ranks(int n, FakeNcclWorld& world, const std::function<void(Communicator&)>& fn) {
  auto boot = make_fake_world(n);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < n; ++r) comms.push_back(make_nccl_communicator(std::move(boot[static_cast<size_t>(r)]), world.api(r)));
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(*comms[static_cast<size_t>(r)]);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}
bool member(const std::vector<int>& g, int r) { return std::find(g.begin(), g.end(), r) != g.end(); }
}  // namespace

TEST_CASE("NCCL communicators are created in the declared order, each from its first member's unique id") {
  FakeNcclWorld world;
  auto errors = on_ranks(3, world, [](Communicator& c) {
    for (const auto& g : std::vector<std::vector<int>>{{0, 1, 2}, {0, 1}, {1, 2}})
      if (member(g, c.rank())) c.prepare_group(g, 0);
  });
  CHECK(errors == std::vector<std::string>(3));
  // Ids are numbered as made: rank 0 makes the first two, rank 1 (first of {1, 2}) the third.
  CHECK(world.log(0) == std::vector<std::string>{"unique_id 1", "init nranks=3 rank=0 id=1", "unique_id 2",
                                                 "init nranks=2 rank=0 id=2"});
  CHECK(world.log(1) == std::vector<std::string>{"init nranks=3 rank=1 id=1", "init nranks=2 rank=1 id=2", "unique_id 3",
                                                 "init nranks=2 rank=0 id=3"});
  CHECK(world.log(2) == std::vector<std::string>{"init nranks=3 rank=2 id=1", "init nranks=2 rank=1 id=3"});
}

TEST_CASE("a group whose stream is limited to N multiprocessors gets a communicator capped at N CTAs") {
  FakeNcclWorld world;
  auto errors = on_ranks(2, world, [](Communicator& c) {
    c.limit_sms({0, 1}, 4, 20);  // the expert channel, say: `shard ... on stream comm sms 20`
    c.prepare_group({0, 1}, 1);  // another channel of the same ranks: not limited
    c.prepare_group({0, 1}, 4);
  });
  CHECK(errors == std::vector<std::string>(2));
  CHECK(world.log(0) == std::vector<std::string>{"unique_id 1", "init nranks=2 rank=0 id=1", "unique_id 2",
                                                 "init nranks=2 rank=0 id=2 max_ctas=20"});
  CHECK(world.log(1) == std::vector<std::string>{"init nranks=2 rank=1 id=1", "init nranks=2 rank=1 id=2 max_ctas=20"});
}

TEST_CASE("NCCL collectives on host buffers: all-reduce, uneven reduce-scatter and all-gather, all-to-all-v") {
  FakeNcclWorld world;
  const std::vector<int> group{0, 1, 2};
  const std::vector<size_t> offsets{0, 3, 5, 7};  // ZeRO's parts may differ: NCCL's are padded
  std::vector<std::vector<float>> scattered(3), gathered(3), gathered_in_place(3);
  std::vector<std::vector<char>> exchanged(3);
  std::vector<float> reduced_f(3);
  std::vector<double> reduced_d(3);
  auto errors = on_ranks(3, world, [&](Communicator& c) {
    const int r = c.rank();
    const size_t me = static_cast<size_t>(r);
    c.prepare_group(group, 0);
    c.prepare_group(group, 1);  // a second channel: its own communicator
    float f = float(r + 1);
    c.all_reduce_sum(&f, 1, group, 0);
    reduced_f[me] = f;
    double d = 0.5 * (r + 1);
    c.all_reduce_sum(&d, 1, group, 1);
    reduced_d[me] = d;
    std::vector<float> in(7);
    for (size_t i = 0; i < 7; ++i) in[i] = float(10 * r + int(i));
    scattered[me].assign(offsets[me + 1] - offsets[me], -1);
    c.reduce_scatter_sum(in.data(), scattered[me].data(), offsets, group, 0);
    std::vector<float> part(offsets[me + 1] - offsets[me], float(100 + r));
    gathered[me].assign(7, -1);
    c.all_gather(part.data(), gathered[me].data(), offsets, group, 1);
    gathered_in_place[me].assign(7, -1);
    std::fill(gathered_in_place[me].begin() + long(offsets[me]), gathered_in_place[me].begin() + long(offsets[me + 1]),
              float(200 + r));
    c.all_gather(nullptr, gathered_in_place[me].data(), offsets, group, 0);
    // Rank r sends j+1 bytes of value 10r+j to member j (its own part included).
    std::vector<size_t> sb{1, 2, 3}, rb(3, me + 1);
    std::vector<char> send;
    for (size_t j = 0; j < 3; ++j) send.insert(send.end(), j + 1, char(10 * r + int(j)));
    exchanged[me].assign(3 * (me + 1), 0);
    c.all_to_all_v(send.data(), sb, exchanged[me].data(), rb, group, 1);
  });
  CHECK(errors == std::vector<std::string>(3));
  for (size_t r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(reduced_f[r] == 6.0f);
    CHECK(reduced_d[r] == 3.0);
    for (size_t i = 0; i < scattered[r].size(); ++i) CHECK(scattered[r][i] == float(30 + 3 * int(offsets[r] + i)));
    CHECK(gathered[r] == std::vector<float>{100, 100, 100, 101, 101, 102, 102});
    CHECK(gathered_in_place[r] == std::vector<float>{200, 200, 200, 201, 201, 202, 202});
    std::vector<char> expect;
    for (int j = 0; j < 3; ++j) expect.insert(expect.end(), r + 1, char(10 * j + int(r)));
    CHECK(exchanged[r] == expect);
  }
}

TEST_CASE("NCCL point-to-point: both directions at once, and messages of one pair in different orders are an error") {
  FakeNcclWorld world;
  auto errors = on_ranks(2, world, [](Communicator& c) {
    const int peer = 1 - c.rank();
    std::vector<int> out{c.rank(), 7}, in(2, -1);
    // Send and receive on separate threads, as the p2p streams do: neither creation blocks the other.
    std::thread sender([&] { c.send(out.data(), sizeof(int) * 2, peer, 5); });
    c.recv(in.data(), sizeof(int) * 2, peer, 5);
    sender.join();
    if (in != std::vector<int>{peer, 7}) throw std::runtime_error("wrong payload");
  });
  CHECK(errors == std::vector<std::string>(2));

  FakeNcclWorld world2;
  errors = on_ranks(2, world2, [](Communicator& c) {
    int x = 1;
    if (c.rank() == 0) {
      c.send(&x, sizeof x, 1, 5);
      c.send(&x, sizeof x, 1, 6);
    } else {
      c.recv(&x, sizeof x, 0, 6);  // expects 6 first: gets 5
    }
  });
  CHECK(errors[0] == "");
  CHECK(errors[1] == "NCCL recv from rank 0: got tag 5 (4 bytes), expected tag 6 (4 bytes): the two ranks issue their "
                     "messages in different orders");
}

TEST_CASE("an asynchronous NCCL error ends a waiting collective with an exception naming it") {
  FakeNcclWorld world;
  std::thread fault([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    world.inject_async_error("unhandled system error (peer rank 1 is gone)");
  });
  auto errors = on_ranks(2, world, [](Communicator& c) {
    c.prepare_group({0, 1}, 0);
    float x = 1;
    if (c.rank() == 0) c.all_reduce_sum(&x, 1, {0, 1}, 0);  // rank 1 never joins
  });
  fault.join();
  CHECK(errors[0] == "NCCL all-reduce on rank 0: unhandled system error (peer rank 1 is gone)");
  CHECK(errors[1] == "");
}

TEST_CASE("abort: every NCCL communicator the rank made is aborted, group and point-to-point, then the job ends") {
  FakeNcclWorld world;
  auto errors = on_ranks(2, world, [](Communicator& c) {
    c.prepare_group({0, 1}, 0);
    float x = 1;
    c.all_reduce_sum(&x, 1, {0, 1}, 0);
    int m = c.rank();
    if (c.rank() == 0) {  // both directions: one two-rank communicator each
      c.send(&m, sizeof m, 1, 5);
      c.recv(&m, sizeof m, 1, 6);
    } else {
      c.recv(&m, sizeof m, 0, 5);
      c.send(&m, sizeof m, 0, 6);
      c.abort("rank 1 failed");
    }
  });
  CHECK(errors[0] == "");
  CHECK(errors[1] == "rank 1 failed");  // the bootstrap ends the job (the fake world throws)
  std::vector<std::string> aborts;
  for (const auto& line : world.log(1))
    if (line.rfind("abort", 0) == 0) aborts.push_back(line);
  CHECK(aborts.size() == 3);  // the group's communicator and both peer communicators
  for (const auto& line : world.log(0)) CHECK(line.rfind("abort", 0) != 0);
}

TEST_CASE("make_nccl_api: the real API where built with NCCL, otherwise an error saying how to build it") {
  if (!nccl_built()) {
    CHECK_THROWS_WITH_AS(make_nccl_api(0), doctest::Contains("built without NCCL"), std::runtime_error);
    return;
  }
  // Linked against CUDA and NCCL: without a GPU the CUDA runtime's own error comes back.
  try {
    auto api = make_nccl_api(0);
    MESSAGE(api->describe());  // a GPU machine
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find("CUDA") != std::string::npos);
  }
}
