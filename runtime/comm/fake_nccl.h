// An in-process NcclApi for tests: threads as ranks, host memory as "device" memory (told apart by
// allocation), streams as queues that complete when their collectives' members have all arrived.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/nccl_api.h"

namespace piper::runtime {

class FakeNcclWorld {
 public:
  FakeNcclWorld();
  ~FakeNcclWorld();
  // The API one rank uses (any number; they share this world's communicators).
  std::unique_ptr<NcclApi> api(int rank);
  // From now on every communicator reports this asynchronous error (a failed peer or link).
  void inject_async_error(const std::string& message);
  // What `rank` asked for, in order: "unique_id <n>", "init nranks=<k> rank=<i> id=<n>[ max_ctas=<c>]",
  // "abort id=<n>".
  std::vector<std::string> log(int rank) const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace piper::runtime
