// What a rank was doing when the launcher stopped it (SIGTERM): its streams, their ops and peers' hosts.
#pragma once
#include <functional>
#include <string>
#include <thread>

namespace piper::runtime {

// When a host dies, mpirun stops the other ranks (SIGTERM, then SIGKILL a second later) with a
// message about daemons that failed to start; each rank's own account names what it waited for
// and on which host. While one of these lives, SIGTERM makes this rank print `who` and `report()`
// ("during step 12; its streams: ... (from rank 2 on host h1)") to stderr and exit with 143. The
// handler only wakes a thread (a pipe), which does the rest.
class StopReport {
 public:
  StopReport(std::string who, std::function<std::string()> report);
  ~StopReport();  // the default action again

 private:
  int pipe_[2] = {-1, -1};
  std::thread thread_;
};

}  // namespace piper::runtime
