// The fake communicator's started sends: what the executor's in-flight sends rely on (ops.cpp).
#include <doctest/doctest.h>

#include <stdexcept>
#include <thread>

#include "runtime/comm/communicator.h"

using namespace piper::runtime;

TEST_CASE("a started send returns before its peer receives, and is done once the peer has") {
  auto world = make_fake_world(2);
  const float a[2] = {1.5f, -2.0f}, b[1] = {7.0f};
  auto first = world[0]->start_send(a, sizeof a, 1, 10);
  auto second = world[0]->start_send(b, sizeof b, 1, 11);  // the sender ran on: nothing received yet
  CHECK_FALSE(first->done());
  CHECK_FALSE(second->done());
  float got_b[1] = {0}, got_a[2] = {0, 0};
  world[1]->recv(got_b, sizeof got_b, 0, 11);  // in the other order: tags, not order, match
  CHECK(second->done());
  CHECK_FALSE(first->done());
  std::thread receiver([&] { world[1]->recv(got_a, sizeof got_a, 0, 10); });
  first->wait();
  receiver.join();
  CHECK(first->done());
  CHECK(got_a[0] == 1.5f);
  CHECK(got_a[1] == -2.0f);
  CHECK(got_b[0] == 7.0f);
}

TEST_CASE("a started send that is never received ends with the job's abort, not a hang") {
  auto world = make_fake_world(2);
  const int x = 3;
  auto pending = world[0]->start_send(&x, sizeof x, 1, 5);
  CHECK_THROWS_AS(world[1]->abort("rank 1 failed"), std::runtime_error);
  CHECK_THROWS_WITH_AS(pending->wait(), doctest::Contains("rank 1 failed"), std::runtime_error);
  CHECK_THROWS_AS(pending->done(), std::runtime_error);
}
