#include "runtime/job/stop_report.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>

namespace piper::runtime {

namespace {
int wake_fd = -1;  // the live StopReport's pipe (one a process)
void on_term(int) {
  const char c = 'T';
  if (wake_fd >= 0) {
    const ssize_t n = write(wake_fd, &c, 1);  // async-signal-safe
    (void)n;
  }
}
}  // namespace

StopReport::StopReport(std::string who, std::function<std::string()> report) {
  if (pipe(pipe_) != 0) return;  // no report, the default action stays
  wake_fd = pipe_[1];
  thread_ = std::thread([fd = pipe_[0], who = std::move(who), report = std::move(report)] {
    char c = 0;
    if (read(fd, &c, 1) != 1 || c != 'T') return;  // closed: the job ended
    const std::string where = report();
    const std::string text = fmt::format("piper-run: {}: stopped by the launcher (SIGTERM) {}\n", who,
                                         where.empty() ? "between steps" : where);
    std::fputs(text.c_str(), stderr);
    std::fflush(stderr);
    _exit(143);
  });
  struct sigaction sa {};
  sa.sa_handler = on_term;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
}

StopReport::~StopReport() {
  if (pipe_[1] < 0) return;
  signal(SIGTERM, SIG_DFL);
  wake_fd = -1;
  const char c = 'E';
  const ssize_t n = write(pipe_[1], &c, 1);
  (void)n;
  if (thread_.joinable()) thread_.join();
  close(pipe_[0]);
  close(pipe_[1]);
}

}  // namespace piper::runtime
