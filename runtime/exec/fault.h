// Fault injection for tests: PIPER_FAULT=RANK:STEP:TOKEN:fail|stall|drop makes op TOKEN of 1-based
// STEP on RANK throw, never return (until the watchdog ends the job), or (a send) not be sent.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace piper::runtime {

struct Fault {
  int rank = -1;
  int64_t step = 0;
  std::string token, kind;  // kind: fail | stall | drop
  bool hits(int at_rank, int64_t at_step, const std::string& op) const { return rank == at_rank && step == at_step && token == op; }
  // Acts out the fault on the op it hits: throws (fail), never returns (stall), or returns true
  // when the op is to be skipped (drop, of a send).
  bool act(bool is_send) const;
};

// The fault a spec asks for; nothing for an empty or missing spec; throws on a malformed one.
std::optional<Fault> parse_fault(const char* spec);

}  // namespace piper::runtime
