// A watchdog for the job's own calls between steps (the step's metrics gathered, a checkpoint saved).
#pragma once
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace piper::runtime {

// The streams' watchdog covers the plan's ops; between steps every rank also all-reduces the step's
// metrics and may save a checkpoint, where a lost host would hang the job unseen. Armed around such a
// call, this one says which call outlived `timeout` on stderr ("rank 3: watchdog: after step 12,
// gathering ... took longer than --op-timeout 5 s") and, a few seconds later (the peers print
// theirs), calls `on_timeout` (the job's abort). A timeout of 0 watches nothing.
class CallWatch {
 public:
  CallWatch(double timeout, std::string who, std::function<void(const std::string&)> on_timeout, double grace = 3);
  ~CallWatch();
  void arm(std::string what);  // the call about to begin
  void disarm();               // it returned
  std::string current();       // the armed call ("" when none)

 private:
  void watch();
  double timeout_, grace_;
  std::string who_;
  std::function<void(const std::string&)> on_timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string what_;  // armed while not empty
  std::chrono::steady_clock::time_point since_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace piper::runtime
