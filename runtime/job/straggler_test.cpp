#include "runtime/job/straggler.h"

#include <doctest/doctest.h>

namespace piper::runtime {

TEST_CASE("a straggler: the host whose ranks compute slower than the plan says, told when it starts and ends") {
  const HostMap two{{0, 0, 1, 1}, {"h0", "h1"}};
  // Host h1 holds the heavier stage: three times the planned compute is no straggler.
  // Over the last 3 steps: one slow step tells nothing (1.34x), the second does.
  StragglerWatch watch({1, 1, 3, 3}, two, 1.5, 3);
  CHECK(watch.step({1.1, 0.9, 3.2, 2.9}) == "");
  CHECK(watch.step({1.0, 1.0, 3.0, 3.0}) == "");
  CHECK(watch.step({1.0, 1.0, 6.0, 6.0}) == "");
  const std::string slow = watch.step({1.0, 1.0, 6.5, 6.0});
  CHECK(slow.find("straggler: host h1 (ranks 2-3) computes 1.7x slower") == 0);
  CHECK(slow.find("5083.3 ms of compute a step and rank") != std::string::npos);  // 30.5 s over 3 steps × 2 ranks
  CHECK(watch.step({1.0, 1.0, 6.6, 6.1}) == "");  // still slow: not told again
  for (int i = 0; i < 3; ++i) CHECK(watch.step({1.0, 1.0, 4.0, 4.0}) == "");  // 1.33x: not yet back
  CHECK(watch.step({1.0, 1.0, 3.0, 3.0}) == "straggler: host h1 keeps pace again");  // 1.22x
  // Host h0 slow now.
  CHECK(watch.step({2.0, 2.2, 3.0, 3.0}) == "");
  CHECK(watch.step({2.0, 2.2, 3.0, 3.0}).find("host h0 (ranks 0-1)") != std::string::npos);
}

TEST_CASE("a straggler needs another host to compare with, and compute in the plan") {
  StragglerWatch one({1, 1}, HostMap{{0, 0}, {"h0"}}, 1.5, 1);
  CHECK(one.step({1, 9}) == "");
  StragglerWatch none({0, 0}, HostMap{{0, 1}, {"h0", "h1"}}, 1.5, 1);
  CHECK(none.step({1, 9}) == "");
}

}  // namespace piper::runtime
