#include "runtime/device/call_watch.h"

#include <doctest/doctest.h>

#include <atomic>

namespace piper::runtime {

TEST_CASE("the call watch: a call past the timeout is named and ends the job, one that returns in time is not") {
  std::atomic<int> fired{0};
  std::string said;
  std::mutex mu;
  {
    CallWatch watch(0.2, "rank 0", [&](const std::string& m) { std::lock_guard lk(mu); said = m; ++fired; }, 0);
    for (int i = 0; i < 3; ++i) {  // calls that return in time, one after another
      watch.arm("after step 1, gathering the step's metrics");
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      watch.disarm();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    CHECK(fired == 0);
    watch.arm("after step 2, saving the checkpoint");
    CHECK(watch.current() == "after step 2, saving the checkpoint");
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    CHECK(fired == 1);
  }
  CHECK(said == "rank 0: watchdog: after step 2, saving the checkpoint took longer than --op-timeout 0.2 s");
  CallWatch off(0, "rank 0", [&](const std::string&) { ++fired; });  // 0: watches nothing
  off.arm("anything");
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(fired == 1);
}

}  // namespace piper::runtime
