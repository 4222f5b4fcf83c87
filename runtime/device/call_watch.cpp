#include "runtime/device/call_watch.h"

#include <fmt/format.h>

#include <cstdio>

namespace piper::runtime {

CallWatch::CallWatch(double timeout, std::string who, std::function<void(const std::string&)> on_timeout, double grace)
    : timeout_(timeout), grace_(grace), who_(std::move(who)), on_timeout_(std::move(on_timeout)) {
  if (timeout_ > 0) thread_ = std::thread([this] { watch(); });
}

CallWatch::~CallWatch() {
  {
    std::lock_guard lk(mu_);
    done_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void CallWatch::arm(std::string what) {
  {
    std::lock_guard lk(mu_);
    what_ = std::move(what);
    since_ = std::chrono::steady_clock::now();
  }
  cv_.notify_all();
}

void CallWatch::disarm() {
  {
    std::lock_guard lk(mu_);
    what_.clear();
  }
  cv_.notify_all();
}

std::string CallWatch::current() {
  std::lock_guard lk(mu_);
  return what_;
}

void CallWatch::watch() {
  std::unique_lock lk(mu_);
  while (!done_) {
    if (what_.empty()) {
      cv_.wait(lk, [&] { return done_ || !what_.empty(); });
      continue;
    }
    const auto since = since_;
    const auto deadline = since + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_));
    // Woken early by disarm, or by a new arm (a later call, its own deadline).
    if (cv_.wait_until(lk, deadline, [&] { return done_ || what_.empty() || since_ != since; })) continue;
    const std::string msg = fmt::format("{}: watchdog: {} took longer than --op-timeout {} s", who_, what_, timeout_);
    lk.unlock();
    std::fprintf(stderr, "%s\n", msg.c_str());
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::duration<double>(grace_));
    try {
      on_timeout_(msg);
    } catch (const std::exception&) {
    }
    return;
  }
}

}  // namespace piper::runtime
